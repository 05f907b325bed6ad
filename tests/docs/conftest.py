"""Loader workers in the docs' blocks start from a fork server: the test runs convoy's servers
in this process, and gRPC's threads do not survive a plain fork (docs/pytorch.md, "Forked
loader workers and gRPC"). The server imports torch and convoy once."""

import multiprocessing

multiprocessing.set_forkserver_preload(["torch", "convoy", "convoy.torch"])
