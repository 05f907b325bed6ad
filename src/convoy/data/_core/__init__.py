"""What every op builds on: the op and node base classes, row streams, composite values,
options and the optional value."""
