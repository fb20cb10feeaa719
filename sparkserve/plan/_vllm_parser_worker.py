"""Run in a subprocess by sparkserve.plan.vllm_args: judge `vllm serve` argvs with vLLM's own parser.

Protocol: one JSON line on stdout when ready ({"ready": true, "vllm_version": …}), then for every JSON
argv read from stdin one JSON verdict line ({"ok": bool, "error": str|null}). vLLM's own log output is
sent to stderr so it cannot corrupt the protocol. Standalone on purpose: it may run in another venv.
Needs VLLM_TARGET_DEVICE=cpu on a machine without a GPU.
"""

import contextlib
import io
import json
import os
import sys

_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # anything vLLM prints goes to stderr
sys.stdout = sys.stderr


def _build():
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand().subparser_init(subparsers)
    post_checked = {}  # dest -> accepted values, for options vLLM validates after parsing (metavar lists)
    for action in serve._actions:
        if isinstance(action.metavar, list | tuple) and action.choices is None:
            post_checked[action.dest] = (action.option_strings[0], [str(v) for v in action.metavar])
    return vllm.__version__, top, validate_parsed_serve_args, post_checked


def _judge(top, validate, post_checked, argv):
    if argv[:2] == ["vllm", "serve"]:
        argv = argv[1:]
    if argv[:1] != ["serve"]:
        return {"ok": False, "error": "not a `vllm serve` argv"}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(list(argv))
            validate(args)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        msg = next((ln.split("error: ", 1)[1] for ln in reversed(lines) if "error: " in ln), None)
        return {"ok": False, "error": msg or (lines[-1] if lines else "rejected")}
    except Exception as e:  # vLLM's post-parse checks raise ValueError/TypeError
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    for dest, (flag, accepted) in post_checked.items():
        value = getattr(args, dest, None)
        if value is not None and str(value) not in accepted and not (dest == "distributed_executor_backend"
                                                                    and "." in str(value)):
            return {"ok": False, "error": f"argument {flag}: invalid value {value!r} (accepted: "
                                          f"{', '.join(accepted)})"}
    return {"ok": True, "error": None}


def main():
    try:
        version, top, validate, post_checked = _build()
    except Exception as e:
        _out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        return 1
    _out.write(json.dumps({"ready": True, "vllm_version": version}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            verdict = _judge(top, validate, post_checked, json.loads(line))
        except Exception as e:
            verdict = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        _out.write(json.dumps(verdict) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
