"""Process foundations under everything: threads, file systems, argument checks, log summaries."""
