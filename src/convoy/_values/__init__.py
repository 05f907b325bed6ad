"""Values on the wire: tensors, nested structures, the codec, slices, pickling."""
