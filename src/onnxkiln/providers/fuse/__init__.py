"""The `fuse` compiling provider (CPU): elementwise partitions compiled to generated kernels."""

from onnxkiln.providers.fuse.provider import (
    DOMAIN,
    OP_TYPE,
    REGISTRY,
    SOURCE_KEY,
    FuseProvider,
)

__all__ = ["DOMAIN", "OP_TYPE", "REGISTRY", "SOURCE_KEY", "FuseProvider"]
