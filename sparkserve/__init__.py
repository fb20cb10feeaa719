"""sparkserve: run a DFlash2 speculative-decoding vLLM stack across DGX Spark nodes."""

from sparkserve.errors import BadInput, GateFailed, RemoteFailure, SparkserveError

__version__ = "0.1.0"
__all__ = ["BadInput", "GateFailed", "RemoteFailure", "SparkserveError", "__version__"]
