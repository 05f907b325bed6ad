"""The ``tfrecord_s3`` workloads: TFRecordDataset over 16 objects of 16 MiB on an S3 test
server (moto's, in a process of its own as a real server would be), and the raw GET
throughput of the same objects fetched by s3fs in the same run (``tfrecord_s3_raw``)."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import convoy as cv
from convoy.testing import free_port

OBJECTS = 16
RECORDS_PER_OBJECT = 256  # of 64 KiB: 16 MiB each
PARALLEL = 8
_files: list[str] = []


def _server() -> list[str]:
    """The objects' URLs, the server started and the objects written on first use."""
    if _files:
        return _files
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(server.kill)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("convoy-bench")
    record = os.urandom(64 * 1024)
    for i in range(OBJECTS):
        url = f"s3://convoy-bench/data/{i:02d}.tfrecord"
        with cv.data.TFRecordWriter(url) as writer:
            for _ in range(RECORDS_PER_OBJECT):
                writer.write(record)
        _files.append(url)
    return _files


def tfrecord_s3() -> float:
    """MB/s of records read by TFRecordDataset, the objects interleaved in parallel."""
    files = _server()
    ds = cv.data.Dataset.from_tensor_slices(files).interleave(
        cv.data.TFRecordDataset, cycle_length=PARALLEL, num_parallel_calls=PARALLEL)
    started = time.perf_counter()
    total = sum(len(record) + 16 for record in ds)  # with the framing, as a GET counts it
    return total / 1e6 / (time.perf_counter() - started)


def tfrecord_s3_raw() -> float:
    """MB/s of the same objects fetched whole by s3fs, as many at a time."""
    import s3fs

    files = _server()
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(PARALLEL) as pool:
        total = sum(pool.map(lambda url: len(fs.cat_file(url)), files))
    return total / 1e6 / (time.perf_counter() - started)
