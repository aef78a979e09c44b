from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HostStatus(_message.Message):
    __slots__ = ("host", "registered", "healthy", "node", "node_pool", "incarnation", "sidecar_away")
    HOST_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NODE_POOL_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_AWAY_FIELD_NUMBER: _ClassVar[int]
    host: int
    registered: bool
    healthy: bool
    node: str
    node_pool: str
    incarnation: str
    sidecar_away: bool
    def __init__(self, host: _Optional[int] = ..., registered: _Optional[bool] = ..., healthy: _Optional[bool] = ..., node: _Optional[str] = ..., node_pool: _Optional[str] = ..., incarnation: _Optional[str] = ..., sidecar_away: _Optional[bool] = ...) -> None: ...

class SliceStatus(_message.Message):
    __slots__ = ("slice", "state", "hosts", "detail")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    slice: int
    state: str
    hosts: _containers.RepeatedCompositeFieldContainer[HostStatus]
    detail: str
    def __init__(self, slice: _Optional[int] = ..., state: _Optional[str] = ..., hosts: _Optional[_Iterable[_Union[HostStatus, _Mapping]]] = ..., detail: _Optional[str] = ...) -> None: ...

class PendingNotice(_message.Message):
    __slots__ = ("slice", "node", "kind", "source", "deadline_unix", "reason")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    slice: int
    node: str
    kind: str
    source: str
    deadline_unix: float
    reason: str
    def __init__(self, slice: _Optional[int] = ..., node: _Optional[str] = ..., kind: _Optional[str] = ..., source: _Optional[str] = ..., deadline_unix: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("role", "job", "generation", "phase", "slices", "active_slices", "inactive_slices", "last_step", "last_committed_step", "pending_notices", "retries_used", "elastic_min_slice_count", "elastic_timeout_seconds", "elastic_max_retries", "trainer_attached", "operator_hold", "last_reason", "slice", "host", "coordinator_connected", "epoch", "fenced_by_epoch", "state_durable", "state_problem", "trainer_processes", "trainer_processes_attached", "straggler_detect", "straggler_slices", "straggler_verdicts")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    PENDING_NOTICES_FIELD_NUMBER: _ClassVar[int]
    RETRIES_USED_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_MIN_SLICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ATTACHED_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_HOLD_FIELD_NUMBER: _ClassVar[int]
    LAST_REASON_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FENCED_BY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_DURABLE_FIELD_NUMBER: _ClassVar[int]
    STATE_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TRAINER_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    TRAINER_PROCESSES_ATTACHED_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_DETECT_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_SLICES_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_VERDICTS_FIELD_NUMBER: _ClassVar[int]
    role: str
    job: str
    generation: int
    phase: str
    slices: _containers.RepeatedCompositeFieldContainer[SliceStatus]
    active_slices: _containers.RepeatedScalarFieldContainer[int]
    inactive_slices: _containers.RepeatedScalarFieldContainer[int]
    last_step: int
    last_committed_step: int
    pending_notices: _containers.RepeatedCompositeFieldContainer[PendingNotice]
    retries_used: int
    elastic_min_slice_count: int
    elastic_timeout_seconds: float
    elastic_max_retries: int
    trainer_attached: bool
    operator_hold: bool
    last_reason: str
    slice: int
    host: int
    coordinator_connected: bool
    epoch: int
    fenced_by_epoch: int
    state_durable: bool
    state_problem: str
    trainer_processes: int
    trainer_processes_attached: _containers.RepeatedScalarFieldContainer[int]
    straggler_detect: bool
    straggler_slices: _containers.RepeatedCompositeFieldContainer[StragglerSlice]
    straggler_verdicts: _containers.RepeatedCompositeFieldContainer[StragglerVerdict]
    def __init__(self, role: _Optional[str] = ..., job: _Optional[str] = ..., generation: _Optional[int] = ..., phase: _Optional[str] = ..., slices: _Optional[_Iterable[_Union[SliceStatus, _Mapping]]] = ..., active_slices: _Optional[_Iterable[int]] = ..., inactive_slices: _Optional[_Iterable[int]] = ..., last_step: _Optional[int] = ..., last_committed_step: _Optional[int] = ..., pending_notices: _Optional[_Iterable[_Union[PendingNotice, _Mapping]]] = ..., retries_used: _Optional[int] = ..., elastic_min_slice_count: _Optional[int] = ..., elastic_timeout_seconds: _Optional[float] = ..., elastic_max_retries: _Optional[int] = ..., trainer_attached: _Optional[bool] = ..., operator_hold: _Optional[bool] = ..., last_reason: _Optional[str] = ..., slice: _Optional[int] = ..., host: _Optional[int] = ..., coordinator_connected: _Optional[bool] = ..., epoch: _Optional[int] = ..., fenced_by_epoch: _Optional[int] = ..., state_durable: _Optional[bool] = ..., state_problem: _Optional[str] = ..., trainer_processes: _Optional[int] = ..., trainer_processes_attached: _Optional[_Iterable[int]] = ..., straggler_detect: _Optional[bool] = ..., straggler_slices: _Optional[_Iterable[_Union[StragglerSlice, _Mapping]]] = ..., straggler_verdicts: _Optional[_Iterable[_Union[StragglerVerdict, _Mapping]]] = ...) -> None: ...

class StragglerSlice(_message.Message):
    __slots__ = ("slice", "status", "lateness", "hits", "counted", "reason")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    slice: int
    status: str
    lateness: _containers.RepeatedScalarFieldContainer[float]
    hits: int
    counted: int
    reason: str
    def __init__(self, slice: _Optional[int] = ..., status: _Optional[str] = ..., lateness: _Optional[_Iterable[float]] = ..., hits: _Optional[int] = ..., counted: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class StragglerVerdict(_message.Message):
    __slots__ = ("time_unix", "slice", "scope", "action", "reason", "slowdown", "lateness", "since_unix", "outcome")
    TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    LATENESS_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    time_unix: float
    slice: int
    scope: str
    action: str
    reason: str
    slowdown: float
    lateness: float
    since_unix: float
    outcome: str
    def __init__(self, time_unix: _Optional[float] = ..., slice: _Optional[int] = ..., scope: _Optional[str] = ..., action: _Optional[str] = ..., reason: _Optional[str] = ..., slowdown: _Optional[float] = ..., lateness: _Optional[float] = ..., since_unix: _Optional[float] = ..., outcome: _Optional[str] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("backlog",)
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    backlog: int
    def __init__(self, backlog: _Optional[int] = ...) -> None: ...

class DecisionEvent(_message.Message):
    __slots__ = ("time_unix", "trigger", "reason", "phase", "generation", "active_slices", "actions", "phases")
    class PhasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    time_unix: float
    trigger: str
    reason: str
    phase: str
    generation: int
    active_slices: _containers.RepeatedScalarFieldContainer[int]
    actions: _containers.RepeatedScalarFieldContainer[str]
    phases: _containers.ScalarMap[str, float]
    def __init__(self, time_unix: _Optional[float] = ..., trigger: _Optional[str] = ..., reason: _Optional[str] = ..., phase: _Optional[str] = ..., generation: _Optional[int] = ..., active_slices: _Optional[_Iterable[int]] = ..., actions: _Optional[_Iterable[str]] = ..., phases: _Optional[_Mapping[str, float]] = ...) -> None: ...

class HoldRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("reason", "timeout_seconds")
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    timeout_seconds: float
    def __init__(self, reason: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class DrainSliceRequest(_message.Message):
    __slots__ = ("slice", "reason")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    slice: int
    reason: str
    def __init__(self, slice: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class UndrainSliceRequest(_message.Message):
    __slots__ = ("slice", "reason", "force")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    slice: int
    reason: str
    force: bool
    def __init__(self, slice: _Optional[int] = ..., reason: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("reason", "restart")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESTART_FIELD_NUMBER: _ClassVar[int]
    reason: str
    restart: bool
    def __init__(self, reason: _Optional[str] = ..., restart: _Optional[bool] = ...) -> None: ...

class CommandReply(_message.Message):
    __slots__ = ("generation", "phase", "reason")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    generation: int
    phase: str
    reason: str
    def __init__(self, generation: _Optional[int] = ..., phase: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("committed_step", "flush_seconds", "generation")
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    FLUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    committed_step: int
    flush_seconds: float
    generation: int
    def __init__(self, committed_step: _Optional[int] = ..., flush_seconds: _Optional[float] = ..., generation: _Optional[int] = ...) -> None: ...
