from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CAPABILITY_BATCH: Capability
CAPABILITY_MEMBERS: Capability
CAPABILITY_UNSPECIFIED: Capability
DESCRIPTOR: _descriptor.FileDescriptor
ERROR_CODE_BAD_FRAME: ErrorCode
ERROR_CODE_FRAME_TOO_LARGE: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_NO_LEADER: ErrorCode
ERROR_CODE_SHUTTING_DOWN: ErrorCode
ERROR_CODE_TOO_MANY_CLIENTS: ErrorCode
ERROR_CODE_TOO_MANY_IDS: ErrorCode
ERROR_CODE_UNAUTHORIZED: ErrorCode
ERROR_CODE_UNEXPECTED_FRAME: ErrorCode
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_UNSUPPORTED_VERSION: ErrorCode

class Ack(_message.Message):
    __slots__ = ["delivery_ids", "ranges"]
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    ranges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., ranges: _Optional[_Iterable[int]] = ...) -> None: ...

class Deliver(_message.Message):
    __slots__ = ["attempt", "delivery_id", "headers", "key", "offset", "partition", "timestamp_ms", "value"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    delivery_id: int
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    key: bytes
    offset: int
    partition: int
    timestamp_ms: int
    value: bytes
    def __init__(self, delivery_id: _Optional[int] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., timestamp_ms: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class DeliverBatch(_message.Message):
    __slots__ = ["deliveries"]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Deliver]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Deliver, _Mapping]]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ["code", "fatal", "message", "retry_after_ms"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    fatal: bool
    message: str
    retry_after_ms: int
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., fatal: bool = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ["ack", "deliver", "deliver_batch", "error", "goodbye", "hello", "members", "nack", "ping", "pong", "redirect", "touch", "welcome"]
    ACK_FIELD_NUMBER: _ClassVar[int]
    DELIVER_BATCH_FIELD_NUMBER: _ClassVar[int]
    DELIVER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    TOUCH_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    deliver: Deliver
    deliver_batch: DeliverBatch
    error: Error
    goodbye: Goodbye
    hello: Hello
    members: Members
    nack: Nack
    ping: Ping
    pong: Pong
    redirect: Redirect
    touch: Touch
    welcome: Welcome
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., deliver: _Optional[_Union[Deliver, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ..., touch: _Optional[_Union[Touch, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., members: _Optional[_Union[Members, _Mapping]] = ..., deliver_batch: _Optional[_Union[DeliverBatch, _Mapping]] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ["reason"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ["key", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ["auth_token", "capabilities", "client_id", "max_frame_size", "max_in_flight", "observer", "protocol_version", "weight"]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OBSERVER_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    auth_token: str
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    client_id: str
    max_frame_size: int
    max_in_flight: int
    observer: bool
    protocol_version: int
    weight: int
    def __init__(self, client_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., max_in_flight: _Optional[int] = ..., auth_token: _Optional[str] = ..., max_frame_size: _Optional[int] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., weight: _Optional[int] = ..., observer: bool = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ["address"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class Members(_message.Message):
    __slots__ = ["members", "version"]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    version: MembersVersion
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., version: _Optional[_Union[MembersVersion, _Mapping]] = ...) -> None: ...

class MembersVersion(_message.Message):
    __slots__ = ["epoch", "generation"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    generation: int
    def __init__(self, epoch: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ["delay_ms", "delivery_ids", "ranges", "reason", "unprocessed"]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNPROCESSED_FIELD_NUMBER: _ClassVar[int]
    delay_ms: int
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    ranges: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    unprocessed: bool
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., ranges: _Optional[_Iterable[int]] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ..., unprocessed: bool = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ["nonce"]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ["nonce"]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class Redirect(_message.Message):
    __slots__ = ["epoch", "leader_address", "leader_node_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_address: str
    leader_node_id: str
    def __init__(self, leader_address: _Optional[str] = ..., leader_node_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class Touch(_message.Message):
    __slots__ = ["delivery_ids", "ranges"]
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    ranges: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., ranges: _Optional[_Iterable[int]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ["ack_timeout_ms", "capabilities", "heartbeat_ms", "liveness_intervals", "max_frame_size", "max_in_flight", "members", "members_version", "node_id", "observer", "protocol_version", "session_id", "topic"]
    ACK_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_INTERVALS_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVER_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ack_timeout_ms: int
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    heartbeat_ms: int
    liveness_intervals: int
    max_frame_size: int
    max_in_flight: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    members_version: MembersVersion
    node_id: str
    observer: bool
    protocol_version: int
    session_id: int
    topic: str
    def __init__(self, node_id: _Optional[str] = ..., session_id: _Optional[int] = ..., protocol_version: _Optional[int] = ..., max_in_flight: _Optional[int] = ..., ack_timeout_ms: _Optional[int] = ..., heartbeat_ms: _Optional[int] = ..., liveness_intervals: _Optional[int] = ..., max_frame_size: _Optional[int] = ..., topic: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., observer: bool = ..., members_version: _Optional[_Union[MembersVersion, _Mapping]] = ...) -> None: ...

class Capability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
