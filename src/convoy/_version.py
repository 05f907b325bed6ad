"""convoy's version, in one leaf module that the package, its metrics and the build read."""

__version__ = "0.1.0"
