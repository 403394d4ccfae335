"""Custom-derivative building blocks: the PyLayer-style Function and the
implicit-function-theorem rule shared by fixed_point and root."""
from odekit.custom.function import Function, FunctionCtx

__all__ = ["Function", "FunctionCtx"]
