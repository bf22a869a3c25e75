"""`python -m pytest --as-amx`: this process and every Python process the tests start (this folder is put first on
their PYTHONPATH) run as on a CPU with AMX, where `--dtype auto` picks bf16 autocast (`rookworld.net.device.cpu_bf16`
answers "amx_bf16"), so that a machine without AMX tests that route too. Patched as the module is first imported,
so that a process that never imports rookworld (Stockfish's wrapper, a tool) pays nothing."""

import importlib.abc
import importlib.machinery
import sys

MODULE = "rookworld.net.device"


def as_amx(module) -> None:
    module.cpu_bf16 = lambda: "amx_bf16"


class _AsAmx(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            as_amx(module)

        spec.loader.exec_module = exec_module
        return spec


if MODULE in sys.modules:
    as_amx(sys.modules[MODULE])
else:
    sys.meta_path.insert(0, _AsAmx())
