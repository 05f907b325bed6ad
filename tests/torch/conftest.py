"""Loader workers in these tests start from a fork server: the tests run convoy's servers in
this process (a InProcessCluster), and gRPC's threads do not survive a plain fork (see
docs/pytorch.md, "Forked loader workers and gRPC"). The server imports torch and convoy
once, so a loader worker starts as fast as a forked one."""

import multiprocessing

multiprocessing.set_forkserver_preload(["torch", "convoy", "convoy.torch"])
