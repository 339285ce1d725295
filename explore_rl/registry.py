"""Things registered by name and chosen in the config: explorers, tasks, rewards, policy
losses, advantage estimators. One mechanism for all of them:

    LOSSES = Registry("rl.policy")
    @LOSSES.register("ppo_clip")
    def ppo_clip(x, c): ...
    LOSSES.get(config.rl.policy)     # a config error naming the known ones if absent

With `package`, a name not yet registered is first looked for as the module
`<package>.<name>`, so a new method or task is one module and no other edit. A name
`module:Name` is `Name` of a module of your own, imported then (outside the package).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import traceback


def load(spec: str, config_key: str):
    """`name` of the module `module.path` for `spec` = "module.path:name" (a user's own,
    imported now); a config error naming `config_key` and what is missing, or where the
    module's own code failed as it was imported."""
    module_name, _, name = spec.partition(":")
    said = f"config: {config_key}={spec!r}"
    if not module_name or not name:
        raise ValueError(f"{said}: give 'module.path:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{said}: cannot import {module_name} ({e})") from None
    except SyntaxError as e:
        raise ValueError(f"{said}: {e.filename}:{e.lineno}: {e.msg}") from None
    except Exception as e:  # the module's own code failed as it was imported: where it did
        origin = importlib.util.find_spec(module_name).origin
        frames = traceback.extract_tb(e.__traceback__)
        frame = next((f for f in reversed(frames) if f.filename == origin), frames[-1])
        raise ValueError(
            f"{said}: importing {module_name} raised {type(e).__name__}: {e} "
            f"({frame.filename}:{frame.lineno})"
        ) from None
    if not hasattr(module, name):
        raise ValueError(f"{said}: {module_name} has no {name!r}")
    return getattr(module, name)


class Registry(dict):
    def __init__(self, config_key: str, package: str | None = None):
        super().__init__()
        self.config_key, self.package = config_key, package

    def register(self, name: str):
        """A decorator registering its argument as `name` (twice under one name is an
        error, so two modules cannot silently shadow each other)."""

        def add(obj):
            if name in self and self[name] is not obj:
                raise ValueError(f"{self.config_key}: {name!r} is registered twice")
            self[name] = obj
            return obj

        return add

    def get(self, name: str):
        if ":" in name:
            return load(name, self.config_key)
        if name not in self and self.package:
            module = f"{self.package}.{name}"
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name != module:
                    raise
        if name not in self:
            raise ValueError(f"config: {self.config_key}={name!r}: known {self.known()}")
        return self[name]

    def known(self) -> list[str]:
        """Every name, the ones whose module has not been imported yet too."""
        if self.package:
            for m in pkgutil.iter_modules(importlib.import_module(self.package).__path__):
                importlib.import_module(f"{self.package}.{m.name}")
        return sorted(self)
