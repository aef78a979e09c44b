from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainerHello(_message.Message):
    __slots__ = ("job", "step_in_memory", "generation", "active_slices", "total_steps", "elastic_min_slice_count", "elastic_timeout_seconds", "elastic_max_retries", "has_elastic_settings", "epoch", "epoch_coordinator", "epoch_proof", "committed_step", "held", "process_index", "process_count", "host")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_IN_MEMORY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_MIN_SLICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    HAS_ELASTIC_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_PROOF_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PROCESS_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    job: str
    step_in_memory: int
    generation: int
    active_slices: _containers.RepeatedScalarFieldContainer[int]
    total_steps: int
    elastic_min_slice_count: int
    elastic_timeout_seconds: float
    elastic_max_retries: int
    has_elastic_settings: bool
    epoch: int
    epoch_coordinator: str
    epoch_proof: bytes
    committed_step: int
    held: bool
    process_index: int
    process_count: int
    host: str
    def __init__(self, job: _Optional[str] = ..., step_in_memory: _Optional[int] = ..., generation: _Optional[int] = ..., active_slices: _Optional[_Iterable[int]] = ..., total_steps: _Optional[int] = ..., elastic_min_slice_count: _Optional[int] = ..., elastic_timeout_seconds: _Optional[float] = ..., elastic_max_retries: _Optional[int] = ..., has_elastic_settings: _Optional[bool] = ..., epoch: _Optional[int] = ..., epoch_coordinator: _Optional[str] = ..., epoch_proof: _Optional[bytes] = ..., committed_step: _Optional[int] = ..., held: _Optional[bool] = ..., process_index: _Optional[int] = ..., process_count: _Optional[int] = ..., host: _Optional[str] = ...) -> None: ...

class StepReport(_message.Message):
    __slots__ = ("step", "step_seconds", "generation")
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    step: int
    step_seconds: float
    generation: int
    def __init__(self, step: _Optional[int] = ..., step_seconds: _Optional[float] = ..., generation: _Optional[int] = ...) -> None: ...

class SliceError(_message.Message):
    __slots__ = ("slices", "message", "step", "generation")
    SLICES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedScalarFieldContainer[int]
    message: str
    step: int
    generation: int
    def __init__(self, slices: _Optional[_Iterable[int]] = ..., message: _Optional[str] = ..., step: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class HeldAck(_message.Message):
    __slots__ = ("generation", "step", "committed_step", "flush_seconds", "flush_bytes", "flush_error")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    FLUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FLUSH_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLUSH_ERROR_FIELD_NUMBER: _ClassVar[int]
    generation: int
    step: int
    committed_step: int
    flush_seconds: float
    flush_bytes: int
    flush_error: str
    def __init__(self, generation: _Optional[int] = ..., step: _Optional[int] = ..., committed_step: _Optional[int] = ..., flush_seconds: _Optional[float] = ..., flush_bytes: _Optional[int] = ..., flush_error: _Optional[str] = ...) -> None: ...

class ResumedAck(_message.Message):
    __slots__ = ("generation", "step", "active_slices", "restored_from", "rebuild_seconds")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    REBUILD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    step: int
    active_slices: _containers.RepeatedScalarFieldContainer[int]
    restored_from: str
    rebuild_seconds: float
    def __init__(self, generation: _Optional[int] = ..., step: _Optional[int] = ..., active_slices: _Optional[_Iterable[int]] = ..., restored_from: _Optional[str] = ..., rebuild_seconds: _Optional[float] = ...) -> None: ...

class FlushedAck(_message.Message):
    __slots__ = ("generation", "committed_step", "flush_seconds", "flush_bytes", "flush_error")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    FLUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FLUSH_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLUSH_ERROR_FIELD_NUMBER: _ClassVar[int]
    generation: int
    committed_step: int
    flush_seconds: float
    flush_bytes: int
    flush_error: str
    def __init__(self, generation: _Optional[int] = ..., committed_step: _Optional[int] = ..., flush_seconds: _Optional[float] = ..., flush_bytes: _Optional[int] = ..., flush_error: _Optional[str] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class TrainerMessage(_message.Message):
    __slots__ = ("hello", "step", "slice_error", "held", "resumed", "flushed", "finished")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SLICE_ERROR_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    hello: TrainerHello
    step: StepReport
    slice_error: SliceError
    held: HeldAck
    resumed: ResumedAck
    flushed: FlushedAck
    finished: Finished
    def __init__(self, hello: _Optional[_Union[TrainerHello, _Mapping]] = ..., step: _Optional[_Union[StepReport, _Mapping]] = ..., slice_error: _Optional[_Union[SliceError, _Mapping]] = ..., held: _Optional[_Union[HeldAck, _Mapping]] = ..., resumed: _Optional[_Union[ResumedAck, _Mapping]] = ..., flushed: _Optional[_Union[FlushedAck, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class Hold(_message.Message):
    __slots__ = ("generation", "flush", "down_slices", "reason", "at_step", "snapshot", "prepare_wait_seconds")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    DOWN_SLICES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_STEP_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    PREPARE_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    flush: bool
    down_slices: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    at_step: int
    snapshot: bool
    prepare_wait_seconds: float
    def __init__(self, generation: _Optional[int] = ..., flush: _Optional[bool] = ..., down_slices: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., at_step: _Optional[int] = ..., snapshot: _Optional[bool] = ..., prepare_wait_seconds: _Optional[float] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("generation", "active_slices", "source", "reason")
    class Source(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SOURCE_UNSPECIFIED: _ClassVar[Resume.Source]
        MEMORY: _ClassVar[Resume.Source]
        CHECKPOINT: _ClassVar[Resume.Source]
    SOURCE_UNSPECIFIED: Resume.Source
    MEMORY: Resume.Source
    CHECKPOINT: Resume.Source
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    generation: int
    active_slices: _containers.RepeatedScalarFieldContainer[int]
    source: Resume.Source
    reason: str
    def __init__(self, generation: _Optional[int] = ..., active_slices: _Optional[_Iterable[int]] = ..., source: _Optional[_Union[Resume.Source, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Flush(_message.Message):
    __slots__ = ("generation", "reason")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    generation: int
    reason: str
    def __init__(self, generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("generation", "exit_code", "reason")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    generation: int
    exit_code: int
    reason: str
    def __init__(self, generation: _Optional[int] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Prepare(_message.Message):
    __slots__ = ("active", "generation", "reason")
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    active: _containers.RepeatedScalarFieldContainer[int]
    generation: int
    reason: str
    def __init__(self, active: _Optional[_Iterable[int]] = ..., generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SidecarCommand(_message.Message):
    __slots__ = ("hold", "resume", "flush", "abort", "prepare", "epoch", "epoch_coordinator", "epoch_proof")
    HOLD_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_PROOF_FIELD_NUMBER: _ClassVar[int]
    hold: Hold
    resume: Resume
    flush: Flush
    abort: Abort
    prepare: Prepare
    epoch: int
    epoch_coordinator: str
    epoch_proof: bytes
    def __init__(self, hold: _Optional[_Union[Hold, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., flush: _Optional[_Union[Flush, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., prepare: _Optional[_Union[Prepare, _Mapping]] = ..., epoch: _Optional[int] = ..., epoch_coordinator: _Optional[str] = ..., epoch_proof: _Optional[bytes] = ...) -> None: ...
