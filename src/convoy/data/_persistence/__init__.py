"""Datasets on disk in TensorFlow's layouts: ``save``/``load``, ``snapshot`` and the
distributed snapshot's layout."""
