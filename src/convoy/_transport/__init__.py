"""Transport: gRPC calls, framed sockets, streams, channels, security, event ladders."""
