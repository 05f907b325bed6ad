"""Operations on values, TensorFlow's tf.* functions: array ops, image, strings, sparse, ragged."""
