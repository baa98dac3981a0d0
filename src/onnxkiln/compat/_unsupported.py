"""onnxruntime calls onnxkiln cannot honour: each raises one `NotImplemented` error naming
the call and saying why (never an AttributeError), or is accepted as a no-op where
onnxruntime's effect is only a tuning knob."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxkiln.compat._errors import NotImplemented as OrtNotImplemented

__all__ = [
    "CLASS_CONSTRUCTORS",
    "METHODS",
    "MODULE_CLASSES",
    "MODULE_FUNCTIONS",
    "add_refusals",
    "refusal",
    "refused_class",
]

_NO_EP_LIBS = ("onnxkiln has no plugin execution providers; pass providers=[...] to "
               "InferenceSession")
_NO_DEVICE = "onnxkiln.compat keeps values in host memory"

# module-level functions: name -> why
MODULE_FUNCTIONS = {
    "register_execution_provider_library": _NO_EP_LIBS,
    "unregister_execution_provider_library": _NO_EP_LIBS,
    "get_ep_devices": _NO_EP_LIBS,
    "copy_tensors": _NO_DEVICE,
}
MODULE_CLASSES = {
    "ModelCompiler": "onnxkiln has no model compiler (see onnxkiln's EPContext export)",
}
# refused class -> its class-level constructors, refused by name too
CLASS_CONSTRUCTORS: dict[str, tuple[str, ...]] = {}
# class name -> {method: why}
METHODS = {
    "InferenceSession": {
        "run_with_ortvaluevector": "use run_with_ort_values",
        "get_tuning_results": "onnxkiln has no kernel tuning",
        "set_tuning_results": "onnxkiln has no kernel tuning",
        "release_captured_graph": "onnxkiln's capture is InferenceSession."
                                  "try_capture_with_device_bindings",
        "set_ep_dynamic_options": _NO_EP_LIBS,
        "create_ortvalue_from_shape_and_type": "use OrtValue.ortvalue_from_shape_and_type",
    },
    "SessionOptions": {
        "add_provider": _NO_EP_LIBS,
        "set_provider_selection_policy_delegate": _NO_EP_LIBS,
        "set_ep_context_data_read_func": "EPContext blobs are read from the model's folder",
        "set_load_cancellation_flag": "a session build cannot be cancelled",
    },
}


def refusal(call: str, why: str) -> Callable[..., Any]:
    """A function that raises NotImplemented("<call>: not supported by onnxkiln; <why>")."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OrtNotImplemented(f"{call}: not supported by onnxkiln; {why}")
    refuse.__name__ = call.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Not supported: {why}."
    return refuse


def refused_class(name: str, why: str) -> type:
    """A class whose construction (and class-level constructors) raise NotImplemented
    naming it."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        refusal(name, why)()
    members: dict[str, Any] = {
        method: staticmethod(refusal(f"{name}.{method}", why))
        for method in CLASS_CONSTRUCTORS.get(name, ())}
    return type(name, (), {**members, "__init__": __init__, "__doc__": f"Not supported: {why}.",
                           "__module__": "onnxkiln.compat"})


def add_refusals(cls: type) -> type:
    """Give `cls` the refusing methods METHODS lists for its name."""
    for method, why in METHODS.get(cls.__name__, {}).items():
        setattr(cls, method, refusal(f"{cls.__name__}.{method}", why))
    return cls
