"""Which config.json fields transformers' own code reads for an architecture, derived from its source.

A field matters to a model's outputs only where transformers' code for that architecture reads it, so this is
what engine_core/families/transformers_reads.py records per family (tests/unit/engine_core/families/
test_config_reads.py re-derives it from the installed transformers). Read means, in the source's syntax tree:
- a field the configuration class declares (its annotations, its bases' included, not a ClassVar), and a
  `self.X`, `getattr(self, "X")` or `kwargs.get("X")` / `kwargs.pop("X")` read in its module (legacy names it
  converts) that is not one of the class's own constants; both names of each alias in its attribute_map;
- `config.X` (or `self.config.X`, `text_config.X`, `getattr(config, "X", ...)`) in the module of the causal LM
  class, and in the shared modules that build what its forward pass uses: the rotary tables
  (modeling_rope_utils, legacy rope keys included), the masks (masking_utils) and the KV cache (cache_utils).
Private names (a leading underscore) and the configuration class's methods are not fields. modeling_utils (the
loader) is not read: what it reads is loading bookkeeping but quantization_config, which says what the weights are
and which engine_core/families/quantization.py answers by method.

Run `python tests/support/transformers_reads.py` to print the data module for the installed transformers.
"""

import ast
import importlib
import inspect

import transformers
from transformers.configuration_utils import PreTrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

SHARED_MODULES = ("modeling_rope_utils", "masking_utils", "cache_utils")


def _is_config(node: ast.expr, self_is_config: bool) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "config" or node.id.endswith("_config") or (self_is_config and node.id == "self")
    return isinstance(node, ast.Attribute) and (node.attr == "config" or node.attr.endswith("_config"))


def _string_argument(call: ast.Call, index: int) -> str | None:
    if len(call.args) > index and isinstance(call.args[index], ast.Constant) and isinstance(call.args[index].value, str):
        return call.args[index].value
    return None


def _reads(source: str, self_is_config: bool = False, kwargs_too: bool = False) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _is_config(node.value,
                                                                                               self_is_config):
            found.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = _string_argument(node, 1)
            if name and _is_config(node.args[0], self_is_config):
                found.add(name)
        elif (kwargs_too and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop") and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "kwargs"):
            name = _string_argument(node, 0)
            if name:
                found.add(name)
    return {name for name in found if not name.startswith("_") and not callable(getattr(PreTrainedConfig, name, None))}


def _source(module) -> str:
    return inspect.getsource(module)


def derive(model_type: str) -> frozenset[str]:
    """The config fields transformers reads for `model_type`'s causal LM (its configuration class and modeling
    module, and the shared rotary, mask and cache code)."""
    config_class = CONFIG_MAPPING[model_type]
    fields, constants = set(), set()  # constants: class attributes that are not fields (a ClassVar, a table)
    for cls in config_class.__mro__[:-1]:  # not object
        for name, kind in inspect.get_annotations(cls).items():
            (constants if "ClassVar" in str(kind) else fields).add(name)
        constants |= {name for name in vars(cls) if not name.startswith("__")}
    fields = {name for name in fields if not name.startswith("_")}
    fields |= set(config_class.attribute_map) | set(config_class.attribute_map.values())  # aliases of fields
    fields |= _reads(_source(inspect.getmodule(config_class)), self_is_config=True, kwargs_too=True) - (constants - fields)
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    fields |= _reads(_source(inspect.getmodule(model_class)))
    for name in SHARED_MODULES:
        module = importlib.import_module(f"transformers.{name}")
        fields |= _reads(_source(module), kwargs_too=name == "modeling_rope_utils")
    return frozenset(fields)


def data_module(model_types: dict[str, str]) -> str:
    """engine_core/families/transformers_reads.py's text for {family name: model_type}."""
    lines = [f'TRANSFORMERS_VERSION = "{transformers.__version__}"', "", "READS = {"]
    for family, model_type in model_types.items():
        names = sorted(derive(model_type))
        body, line = [], "       "
        for name in names:
            item = f' "{name}",'
            if len(line) + len(item) > 116:
                body.append(line)
                line = "       "
            line += item
        body.append(line)
        lines += [f'    "{family}": frozenset({{  # {model_type}', *body, "    }),"]
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from engine_core.families.catalog import FAMILIES
    print(data_module({family.name: family.model_type for family in FAMILIES}))
