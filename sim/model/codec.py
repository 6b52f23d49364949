"""Pack and unpack hardware messages from their Amaranth layouts (the one source of truth).

``StructCodec(layout)`` reads field offsets and widths from a ``data.StructLayout`` (or a
``data.Struct`` class) once and then packs dicts into ints and unpacks ints into dicts with
plain shifts; that is ~20x faster than building ``data.Const`` objects per message, which
matters at tens of thousands of messages per test. Enum fields pack from an enum member or
an int and unpack to the int (``codec.name(field, value)`` gives the member's name).
Nested structs are not flattened: pack them with their own codec.
"""
from __future__ import annotations

import enum as py_enum

from amaranth.lib import data


class StructCodec:
    def __init__(self, layout):
        if isinstance(layout, type) and issubclass(layout, data.Struct):
            layout = layout.as_shape()
        self.layout = layout
        self.width = layout.size
        self.fields = []
        self._enums = {}
        for name, field in layout:
            shape = field.shape
            if isinstance(shape, type) and issubclass(shape, py_enum.Enum):
                self._enums[name] = shape
            self.fields.append((name, field.offset, (1 << field.width) - 1))
        self._offsets = {n: (o, mask) for n, o, mask in self.fields}

    def pack(self, **values) -> int:
        word = 0
        for name, value in values.items():
            offset, mask = self._offsets[name]          # KeyError names an unknown field
            value = int(value.value if isinstance(value, py_enum.Enum) else value)
            if value & ~mask:
                raise ValueError(f"{name}={value:#x} does not fit in {mask.bit_length()} bits")
            word |= value << offset
        return word

    def unpack(self, word: int) -> dict[str, int]:
        return {name: (word >> offset) & mask for name, offset, mask in self.fields}

    def get(self, word: int, name: str) -> int:
        offset, mask = self._offsets[name]
        return (word >> offset) & mask

    def name(self, field: str, value: int) -> str:
        enum_cls = self._enums.get(field)
        if enum_cls is None:
            return str(value)
        try:
            return enum_cls(value).name
        except ValueError:
            return f"reserved({value:#x})"
