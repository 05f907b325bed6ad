"""The dispatcher's wing: its state machine (:mod:`.state`, owning its splits, runs and garbage
collection), its vocabulary (:mod:`.events`), its journal (:mod:`.journal`,
:mod:`.journal_format`) and its limits. No module here opens a socket or speaks gRPC: the
gRPC shell is :mod:`convoy.data.service._dispatch_server`."""
