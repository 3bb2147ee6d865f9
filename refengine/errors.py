"""One exception type per category of bad input; every message names the file, tensor or key at fault."""
from __future__ import annotations


class RefengineError(Exception):
    """Base of every error refengine raises on bad input."""


class GGUFError(RefengineError):
    """A GGUF file or split set that cannot be read as written."""


class TruncatedFileError(GGUFError):
    """The file ends before its header, metadata, tensor table or tensor data does."""


class MalformedGGUFError(GGUFError):
    """Bad magic, unsupported version, impossible counts or value types."""


class MissingShardError(GGUFError):
    """A split GGUF names a shard that is not on disk."""


class ShardMismatchError(GGUFError):
    """Shards disagree with each other (split.count, split.no, split.tensors.count, duplicate tensors)."""


class TensorBoundsError(GGUFError):
    """A tensor's bytes run past the end of its shard."""


class UnknownTypeError(GGUFError):
    """A tensor carries a ggml type id this engine does not know."""


class ConfigError(RefengineError):
    """Model metadata that is missing, inconsistent, or asks for math this engine does not implement."""


class MissingKeyError(ConfigError):
    """A required GGUF metadata key is absent."""


class InvalidKeyError(ConfigError):
    """A metadata key of the wrong GGUF value type (an array or string where a number belongs) or out of
    range (a count that is not positive, a float that is not finite, a factor that is not > 0)."""


class UnsupportedArchError(ConfigError):
    """`general.architecture` names an architecture this engine does not implement."""


class WeightError(RefengineError):
    """A weight tensor that is missing or of the wrong shape."""


class MissingTensorError(WeightError):
    pass


class ShapeError(WeightError):
    pass


class NonFiniteError(RefengineError):
    """NaN or inf in a weight or an intermediate, naming where it first appeared."""


class OracleError(RefengineError):
    """The llama.cpp oracle could not be run (not installed, refused the file)."""


class StateFileError(RefengineError):
    """A saved sequence state (`refengine.state_file`) that cannot be written or read back: truncated or corrupt,
    another format version, a container or attribute the format cannot hold."""


class StateMismatchError(StateFileError):
    """A state file saved for another model (another architecture or model file sha256): names both."""


class ExpertBudgetError(RefengineError):
    """The GPU expert cache (refengine/expert_cache.py) cannot hold the experts one layer's batch needs at once:
    names the budget and the layer."""


class DeviceSyncError(RefengineError):
    """Inside a strict device span (`Device.strict()`, refengine/devarray.py) something synchronised with the host
    or moved data across: an upload of a host array (a weight's first one included), a read-back, a NumPy function
    run on the host. Names the op and the array; such a span could not be captured as one CUDA graph."""
