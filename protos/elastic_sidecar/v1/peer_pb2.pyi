from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HostIdentity(_message.Message):
    __slots__ = ("slice", "host", "node", "node_pool", "pod", "incarnation")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NODE_POOL_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    slice: int
    host: int
    node: str
    node_pool: str
    pod: str
    incarnation: str
    def __init__(self, slice: _Optional[int] = ..., host: _Optional[int] = ..., node: _Optional[str] = ..., node_pool: _Optional[str] = ..., pod: _Optional[str] = ..., incarnation: _Optional[str] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("identity", "job", "epoch_seen", "generation_seen", "epoch_seen_coordinator", "epoch_seen_proof", "local_healthy", "health_address", "health_check")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SEEN_FIELD_NUMBER: _ClassVar[int]
    GENERATION_SEEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SEEN_COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SEEN_PROOF_FIELD_NUMBER: _ClassVar[int]
    LOCAL_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_FIELD_NUMBER: _ClassVar[int]
    identity: HostIdentity
    job: str
    epoch_seen: int
    generation_seen: int
    epoch_seen_coordinator: str
    epoch_seen_proof: bytes
    local_healthy: bool
    health_address: str
    health_check: str
    def __init__(self, identity: _Optional[_Union[HostIdentity, _Mapping]] = ..., job: _Optional[str] = ..., epoch_seen: _Optional[int] = ..., generation_seen: _Optional[int] = ..., epoch_seen_coordinator: _Optional[str] = ..., epoch_seen_proof: _Optional[bytes] = ..., local_healthy: _Optional[bool] = ..., health_address: _Optional[str] = ..., health_check: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "local_healthy")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LOCAL_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    seq: int
    local_healthy: bool
    def __init__(self, seq: _Optional[int] = ..., local_healthy: _Optional[bool] = ...) -> None: ...

class LocalReport(_message.Message):
    __slots__ = ("kind", "detail", "deadline_unix", "event_time_unix")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    kind: str
    detail: str
    deadline_unix: float
    event_time_unix: float
    def __init__(self, kind: _Optional[str] = ..., detail: _Optional[str] = ..., deadline_unix: _Optional[float] = ..., event_time_unix: _Optional[float] = ...) -> None: ...

class MetricsWindow(_message.Message):
    __slots__ = ("start_unix", "end_unix", "source", "blind", "collective_p50_seconds", "collective_mean_seconds", "collective_count", "throttle_score", "links_unhealthy")
    START_UNIX_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BLIND_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_MEAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_SCORE_FIELD_NUMBER: _ClassVar[int]
    LINKS_UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    start_unix: float
    end_unix: float
    source: str
    blind: str
    collective_p50_seconds: float
    collective_mean_seconds: float
    collective_count: int
    throttle_score: float
    links_unhealthy: bool
    def __init__(self, start_unix: _Optional[float] = ..., end_unix: _Optional[float] = ..., source: _Optional[str] = ..., blind: _Optional[str] = ..., collective_p50_seconds: _Optional[float] = ..., collective_mean_seconds: _Optional[float] = ..., collective_count: _Optional[int] = ..., throttle_score: _Optional[float] = ..., links_unhealthy: _Optional[bool] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "report", "metrics_window")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    METRICS_WINDOW_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    report: LocalReport
    metrics_window: MetricsWindow
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., report: _Optional[_Union[LocalReport, _Mapping]] = ..., metrics_window: _Optional[_Union[MetricsWindow, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("generation", "heartbeat_interval_seconds", "epoch", "heartbeat_datagram_port", "heartbeat_datagram_token", "epoch_coordinator", "epoch_proof")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_DATAGRAM_PORT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_DATAGRAM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_PROOF_FIELD_NUMBER: _ClassVar[int]
    generation: int
    heartbeat_interval_seconds: float
    epoch: int
    heartbeat_datagram_port: int
    heartbeat_datagram_token: bytes
    epoch_coordinator: str
    epoch_proof: bytes
    def __init__(self, generation: _Optional[int] = ..., heartbeat_interval_seconds: _Optional[float] = ..., epoch: _Optional[int] = ..., heartbeat_datagram_port: _Optional[int] = ..., heartbeat_datagram_token: _Optional[bytes] = ..., epoch_coordinator: _Optional[str] = ..., epoch_proof: _Optional[bytes] = ...) -> None: ...

class HeartbeatDatagram(_message.Message):
    __slots__ = ("slice", "host", "token", "seq", "ack_generation", "ack_kind")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACK_KIND_FIELD_NUMBER: _ClassVar[int]
    slice: int
    host: int
    token: bytes
    seq: int
    ack_generation: int
    ack_kind: str
    def __init__(self, slice: _Optional[int] = ..., host: _Optional[int] = ..., token: _Optional[bytes] = ..., seq: _Optional[int] = ..., ack_generation: _Optional[int] = ..., ack_kind: _Optional[str] = ...) -> None: ...

class CommandDatagram(_message.Message):
    __slots__ = ("body", "mac")
    BODY_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    mac: bytes
    def __init__(self, body: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...

class CommandDatagramBody(_message.Message):
    __slots__ = ("slice", "host", "command")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    slice: int
    host: int
    command: PeerCommand
    def __init__(self, slice: _Optional[int] = ..., host: _Optional[int] = ..., command: _Optional[_Union[PeerCommand, _Mapping]] = ...) -> None: ...

class DatagramsReceived(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeerCommand(_message.Message):
    __slots__ = ("generation", "kind", "reason", "epoch")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    generation: int
    kind: str
    reason: str
    epoch: int
    def __init__(self, generation: _Optional[int] = ..., kind: _Optional[str] = ..., reason: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("registered", "command", "datagrams_received")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    DATAGRAMS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    command: PeerCommand
    datagrams_received: DatagramsReceived
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., command: _Optional[_Union[PeerCommand, _Mapping]] = ..., datagrams_received: _Optional[_Union[DatagramsReceived, _Mapping]] = ...) -> None: ...
