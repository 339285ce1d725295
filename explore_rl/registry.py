"""Things registered by name and chosen in the config: explorers, tasks, rewards, policy
losses, advantage estimators. One mechanism for all of them:

    LOSSES = Registry("rl.policy")
    @LOSSES.register("ppo_clip")
    def ppo_clip(x, c): ...
    LOSSES.get(config.rl.policy)     # a config error naming the known ones if absent

With `package`, a name not yet registered is first looked for as the module
`<package>.<name>`, so a new method or task is one module and no other edit.
"""

from __future__ import annotations

import importlib
import pkgutil


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
