"""Generic config machinery for trees of (frozen) dataclasses: dicts, TOML files and ``key=value`` overrides.

Works for any dataclass whose fields are annotated with simple types (``int``, ``float``, ``bool``, ``str``,
``X | None``, unions, nested dataclasses, lists/tuples/dicts of those). The annotations are resolved with
:func:`typing.get_type_hints`, so ``from __future__ import annotations`` is fine.

* :func:`to_dict` / :func:`from_dict` — nested plain dicts (``None`` values are dropped: TOML has no null).
* :func:`load_toml` / :func:`save_toml` — TOML files (saving is atomic).
* :func:`apply_overrides` — command-line style ``model.n_layer=4`` / ``train.lr=3e-4`` / ``model.attention=gqa``.

Every user mistake (unknown key, wrong type, missing or malformed file, malformed override) is one
:class:`~attnlab.errors.ConfigError` line naming the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

from .atomic import write_text
from .errors import ConfigError, unknown_name

__all__ = ["fold_keys", "to_dict", "from_dict", "load_toml", "save_toml", "load_config", "apply_overrides", "parse_override"]

_NONE_WORDS = ("none", "null")


# ----------------------------------------------------------------------------------------------- dict <-> dataclass


def to_dict(cfg) -> dict:
    """A nested plain dict of dataclass ``cfg`` (nested dataclasses become dicts/tables; ``None`` values dropped)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(cfg).__name__}")
    out = {}
    for f in dataclasses.fields(cfg):
        if not f.init:
            continue
        value = _plain(getattr(cfg, f.name))
        if value is not None:
            out[f.name] = value
    return out


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): p for k, v in value.items() if (p := _plain(v)) is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def from_dict(cls, data, where: str = ""):
    """Build dataclass ``cls`` from a nested dict, checking every key and value type against the annotations.

    ``where`` is the dotted path of ``data`` inside the whole config (used in error messages, e.g. ``"train"``).
    Nested dataclass fields accept a dict (table); a union such as ``str | AttentionConfig`` accepts either.
    An ``int`` is accepted (and converted) for a ``float`` field; a ``bool`` is never an ``int``.
    A dataclass may define a classmethod ``migrate_dict(data, where)`` that rewrites the keys of older configs
    into today's shape before they are checked (the documented migration of a renamed or nested key).
    """
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise TypeError(f"from_dict expects a dataclass type, got {cls!r}")
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where or cls.__name__}={_show(data)} has the wrong type: expected a table of "
            f"{cls.__name__} fields, got {type(data).__name__}"
        )
    migrate = getattr(cls, "migrate_dict", None)  # older keys in today's shape (e.g. AttentionConfig's flat ones)
    if migrate is not None:
        data = migrate(dict(data), where or cls.__name__)
    hints = _hints(cls)
    fields = _init_fields(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(where, str(key), fields)
        kwargs[key] = _coerce(hints[key], value, _join(where, key))
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key {_join(where, name)!r} ({_describe(hints[name])})")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise _located(e, where) from None


def fold_keys(data: Mapping, table: str, flat: Mapping[str, str], name_field: str | None = None) -> dict:
    """``data`` with the keys of older configs folded into the nested table ``table``: each key of ``flat`` present
    in ``data`` moves into the table under the field ``flat`` maps it to, and a name in ``table`` itself (a string)
    stands for ``{name_field: name}``. The migration a ``migrate_dict`` of a dataclass uses for a table that was once
    flat fields (AttentionConfig: magnitude_t -> magnitude.t)."""
    moved = {key: data[key] for key in flat if key in data}
    named = name_field is not None and isinstance(data.get(table), str)
    if not moved and not named:
        return dict(data)
    out = {k: v for k, v in data.items() if k not in flat}
    current = out.get(table) or {}
    nested = {name_field: current} if named else dict(current)
    nested.update({flat[key]: value for key, value in moved.items()})
    out[table] = nested
    return out


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _init_fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


def _unknown_key(where: str, key: str, fields) -> ConfigError:
    return unknown_name("config key", _join(where, key), [_join(where, name) for name in fields])


def _located(err: ConfigError, where: str) -> ConfigError:
    """Prefix an error raised by a dataclass's own validation with the section it came from."""
    msg = str(err)
    if not where or msg.startswith(where + ".") or msg.startswith("["):
        return err
    return ConfigError(f"[{where}] {msg}")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _members(tp) -> tuple:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _admits_none(tp) -> bool:
    return tp is typing.Any or type(None) in _members(tp)


def _table_member(tp):
    """The dict/Mapping member of annotation ``tp`` (a free-form table), or None."""
    for m in _members(tp):
        if (typing.get_origin(m) or m) in (dict, Mapping):
            return m
    return None


def _dataclass_member(tp):
    for m in _members(tp):
        if dataclasses.is_dataclass(m) and isinstance(m, type):
            return m
    return None


def _describe(tp) -> str:
    """How an annotation reads in an error message ("an integer", "a string or a table (AttentionConfig)")."""
    if tp is type(None):
        return "none"
    members = _members(tp)
    if len(members) > 1:
        return " or ".join(_describe(m) for m in members)
    origin = typing.get_origin(tp) or tp
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if dataclasses.is_dataclass(tp):
        return f"a table ({tp.__name__})"
    if origin in (list, tuple, Sequence):
        return "a list"
    if origin in (dict, Mapping):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _type_error(tp, value, path) -> ConfigError:
    return ConfigError(
        f"{path}={_show(value)} has the wrong type: expected {_describe(tp)}, got {type(value).__name__}"
    )


def _accepts(tp, value) -> bool:
    """Whether ``value`` fits the single (non-union) annotation ``tp`` as it is (no conversion of tables)."""
    if tp is typing.Any:
        return True
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    origin = typing.get_origin(tp) or tp
    if origin in (list, tuple, Sequence):
        return isinstance(value, (list, tuple))
    if origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if isinstance(origin, type):
        return isinstance(value, origin)
    return True


def _coerce(tp, value, path: str):
    """Check ``value`` against annotation ``tp`` and convert it (table -> dataclass, int -> float, list -> tuple)."""
    if tp is typing.Any:
        return value
    members = _members(tp)
    if len(members) > 1:
        if value is None:
            if type(None) in members:
                return None
            raise _type_error(tp, value, path)
        if isinstance(value, Mapping):  # a table is the dataclass member when there is one
            sub = _dataclass_member(tp)
            if sub is not None:
                return from_dict(sub, value, path)
        for m in members:
            if m is not type(None) and _accepts(m, value):
                return _coerce(m, value, path)
        raise _type_error(tp, value, path)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, path)
        raise _type_error(tp, value, path)
    if not _accepts(tp, value):
        raise _type_error(tp, value, path)
    if tp is float:
        return float(value)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if args and args != ((),):
            if len(args) != len(value):
                raise ConfigError(f"{path}={_show(value)} must have {len(args)} items, got {len(value)}")
            return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        return tuple(value)
    if origin in (list, Sequence) and args:
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping) and len(args) == 2:
        return {k: _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------------------------------------ TOML


def load_toml(path) -> dict:
    """Read a TOML file into a dict; a missing file or a syntax error is a one-line ConfigError naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None


def save_toml(cfg_or_dict, path) -> Path:
    """Write a dataclass (via :func:`to_dict`) or a dict as TOML, atomically (temp file + ``os.replace``)."""
    import tomli_w

    data = _plain(cfg_or_dict)
    if not isinstance(data, dict):
        raise TypeError(f"save_toml expects a dataclass instance or a dict, got {type(cfg_or_dict).__name__}")
    return write_text(path, tomli_w.dumps(data))


def load_config(cls, path):
    """:func:`from_dict` of :func:`load_toml`; errors about the contents are prefixed with the file name."""
    data = load_toml(path)
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# ------------------------------------------------------------------------------------------------------- overrides


def parse_override(item: str) -> tuple[str, str]:
    """Split ``"dotted.key=value"`` into ``("dotted.key", "value")``; a malformed item is a ConfigError."""
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(
            f"malformed override {item!r}: expected KEY=VALUE with a dotted key, "
            f"e.g. model.n_layer=4, train.lr=3e-4 or model.attention=gqa"
        )
    key, _, value = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise ConfigError(
            f"malformed override {item!r}: the key must be a dotted name like train.lr, got {key!r}"
        )
    return ".".join(p.strip() for p in parts), value.strip()


def apply_overrides(cfg, overrides: Sequence[str]):
    """A copy of dataclass ``cfg`` with each ``dotted.key=value`` override applied, validated once at the end.

    The value is a TOML literal when it parses as one (``4``, ``3e-4``, ``true``, ``"quoted"``), else a bare
    string (``gqa``, ``/tmp/x.txt``); ``none``/``null`` unsets an optional field (or removes a key of a free-form
    table such as ``data.task``). Setting a sub-field of a field
    that currently holds a variant name (``model.attention.temperature=2`` with ``attention = "standard"``)
    starts from that variant's AttentionConfig. Because validation runs once after all overrides, overrides
    that must change together (``train.max_steps=10 train.warmup_steps=2``) can be given in any order; a key given
    after one of its own sub-keys (``model.attention.ssmax=true model.attention=gqa``) would replace them, and is a
    one-line ConfigError (give the table first). A dataclass
    may define a classmethod ``migrate_key(parts, raw)`` that moves an older dotted key to today's place
    (AttentionConfig: ``magnitude_t`` -> ``magnitude.t``, ``magnitude=prefix`` -> ``magnitude.form``).
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    if not overrides:
        return cfg
    cls = type(cfg)
    tree = _tree(cfg)
    done: list[str] = []
    for item in overrides:
        key, raw = parse_override(item)
        lost = [k for k in done if k.startswith(key + ".")]
        if lost:  # model.attention.ssmax=true model.attention=gqa would silently drop ssmax
            raise ConfigError(f"override {item!r} replaces all of {key}, so the earlier {', '.join(lost)} would be "
                              f"lost; give {key}=... first, then its sub-keys")
        _assign(tree, cls, key.split("."), raw, "")
        done.append(key)
    return from_dict(cls, tree)


def _tree(obj):
    """Like :func:`to_dict` but keeps ``None`` values (an override tree is rebuilt with :func:`from_dict`)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _tree(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, Mapping):
        return {k: _tree(v) for k, v in obj.items()}
    return obj


def _assign(tree: dict, cls, parts: list[str], raw: str, where: str) -> None:
    fields = _init_fields(cls)
    migrate = getattr(cls, "migrate_key", None)  # an older key in today's place (see from_dict's migrate_dict)
    if migrate is not None:
        parts = migrate(parts, raw)
    key = parts[0]
    path = _join(where, key)
    if key not in fields:
        raise _unknown_key(where, key, fields)
    tp = _hints(cls)[key]
    if len(parts) == 1:
        tree[key] = _parse_value(raw, tp)
        return
    sub, table = _dataclass_member(tp), _table_member(tp)
    if sub is None and table is not None and len(parts) == 2:  # a key of a free-form table, e.g. data.task.m=4
        args = typing.get_args(table)
        current = tree.get(key)
        current = dict(current) if isinstance(current, Mapping) else {}
        if raw.strip().lower() in _NONE_WORDS:
            current.pop(parts[1], None)  # unset: the owner's default applies again
        else:
            current[parts[1]] = _parse_value(raw, args[1] if len(args) == 2 else typing.Any)
        tree[key] = current
        return
    if sub is None:
        raise ConfigError(
            f"{path} is {_describe(tp)} and has no sub-key {parts[1]!r}; set it as {path}=VALUE"
        )
    current = tree.get(key)
    if isinstance(current, str):
        current = _tree(_expand_name(cls, key, current, path))
    elif current is None:
        current = _tree(sub())
    elif dataclasses.is_dataclass(current) and not isinstance(current, type):
        current = _tree(current)
    elif isinstance(current, Mapping):
        current = dict(current)
    else:
        raise ConfigError(f"{path}={_show(current)} has no sub-keys; set it as {path}=VALUE")
    tree[key] = current
    _assign(current, sub, parts[1:], raw, path)


def _expand_name(cls, key: str, name: str, path: str):
    """The dataclass instance that the name in field ``key`` of ``cls`` stands for, from the class's own
    ``named_config(field, name)`` (GPTConfig: a variant name -> its AttentionConfig preset)."""
    if hasattr(cls, "named_config"):
        return cls.named_config(key, name)
    raise ConfigError(f"{path}={name!r} is a name, not a table; set the whole table as {path}={{...}}")


def _parse_value(raw: str, tp):
    """Parse an override's value: a TOML literal if possible, else the bare string (see apply_overrides)."""
    text = raw.strip()
    members = _members(tp)
    if text.lower() in _NONE_WORDS and _admits_none(tp):
        return None
    if text.lower() in ("true", "false") and bool in members:
        return text.lower() == "true"
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = _python_number(text)
        if value is None:
            return text
    # a literal of the wrong kind for a string field ("data.source=2024-01-01") is meant as the bare string
    if not isinstance(value, str) and str in members and not any(_accepts(m, value) for m in members):
        return text
    return value


def _python_number(text: str):
    """Numbers TOML rejects but Python reads (``.5``, ``1.``, ``+.1e-3``); None if ``text`` is not one."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return None
