"""Placeholders for every torchvision name: they can be imported, subclassed and reached by
attribute (``transforms.InterpolationMode.BILINEAR``), so the zoo's modules import; creating or
calling one raises, so nothing silently runs without torchvision."""

_WHY = (
    "is not available: this is the zoo check's stand-in for torchvision (no CPU torchvision "
    "wheel exists for torch 2.13 on PyPI). Run the zoo with its fake data "
    "(use_fake_data: true)."
)


class _Missing(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise ImportError(f"torchvision {cls.__qualname__} {_WHY}")


def placeholder(qualname: str) -> type:
    return _Missing(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


def refuse(module: str):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{module}.{name}")

    return __getattr__
