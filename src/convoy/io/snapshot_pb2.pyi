from convoy.io import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotRecord(_message.Message):
    __slots__ = ("tensor",)
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    tensor: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorProto]
    def __init__(self, tensor: _Optional[_Iterable[_Union[_tensor_pb2.TensorProto, _Mapping]]] = ...) -> None: ...

class SnapshotMetadataRecord(_message.Message):
    __slots__ = ("graph_hash", "run_id", "creation_timestamp", "version", "dtype", "num_elements", "finalized")
    GRAPH_HASH_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_FIELD_NUMBER: _ClassVar[int]
    graph_hash: str
    run_id: str
    creation_timestamp: int
    version: int
    dtype: _containers.RepeatedScalarFieldContainer[_tensor_pb2.DataType]
    num_elements: int
    finalized: bool
    def __init__(self, graph_hash: _Optional[str] = ..., run_id: _Optional[str] = ..., creation_timestamp: _Optional[int] = ..., version: _Optional[int] = ..., dtype: _Optional[_Iterable[_Union[_tensor_pb2.DataType, str]]] = ..., num_elements: _Optional[int] = ..., finalized: _Optional[bool] = ...) -> None: ...

class TensorMetadata(_message.Message):
    __slots__ = ("tensor_shape", "tensor_size_bytes")
    TENSOR_SHAPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    tensor_shape: _tensor_pb2.TensorShapeProto
    tensor_size_bytes: int
    def __init__(self, tensor_shape: _Optional[_Union[_tensor_pb2.TensorShapeProto, _Mapping]] = ..., tensor_size_bytes: _Optional[int] = ...) -> None: ...

class SnapshotTensorMetadata(_message.Message):
    __slots__ = ("tensor_metadata",)
    TENSOR_METADATA_FIELD_NUMBER: _ClassVar[int]
    tensor_metadata: _containers.RepeatedCompositeFieldContainer[TensorMetadata]
    def __init__(self, tensor_metadata: _Optional[_Iterable[_Union[TensorMetadata, _Mapping]]] = ...) -> None: ...

class DistributedSnapshotMetadata(_message.Message):
    __slots__ = ("element_spec", "compression")
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    element_spec: bytes
    compression: str
    def __init__(self, element_spec: _Optional[bytes] = ..., compression: _Optional[str] = ...) -> None: ...
