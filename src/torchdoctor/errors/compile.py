"""torch.compile: graph breaks, recompilations, backend failures."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first, rx

_USER_CODE = r'from user code:\s*File "([^"]+)", line (\d+), in (\S+)\s*\n\s*(.+)'


def _break_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    reason = (
        first(r"Unsupported:\s*(.+?)(?:\s{2,}|\s+Explanation:|$)", message)
        or first(r"Reason:\s*(.+?)\s*$", message)
        or first(r"Graph break(?: in user code)?(?: at \S+)?:?\s*(.+?)\s*$", message)
    )
    if reason:
        f["reason"] = reason.strip().rstrip(".")
    explanation = first(r"Explanation:\s*(.+?)(?:\s+Hint:|\s*$)", text)
    if explanation:
        f["explanation"] = explanation.strip()
    m = rx(_USER_CODE).search(text)
    if m:
        f["location"] = f"{m.group(1)}:{m.group(2)} in {m.group(3)}"
        f["code_line"] = m.group(4).strip()
    else:
        at = first(r"Graph break in user code at (\S+:\d+)", text)
        if at:
            f["location"] = at
    return f


GRAPH_BREAK = Entry(
    code="compile.graph_break",
    title="torch.compile graph break",
    meaning=(
        "Dynamo, torch.compile's front end, met Python it cannot put into a graph. Normally "
        "it splits the graph there and runs that code eagerly (a graph break: slower, and "
        "repeated every call); with fullgraph=True the break is an error. Typical breaks: "
        "branching on a tensor's value, .item(), print, unsupported libraries."
    ),
    patterns=(
        r"torch\._dynamo\.exc\.Unsupported",
        r"\bGraph break(?:s)?\b",
        r"data dependent operator",
        r"Data-dependent branching",
        r"generic_jump TensorVariable|jump with TensorVariable",
        r"Dynamo does not (?:know how to trace|support)",
        r"Failed to trace builtin operator",
        r"call_function BuiltinVariable\(print\)",
        r"Skipping frame because",
    ),
    exceptions=("Unsupported",),
    examples=(
        "torch._dynamo.exc.Unsupported: Data-dependent branching\n  Explanation: Detected "
        "data-dependent branching (e.g. `if my_tensor.sum() > 0:`). Dynamo does not support "
        "tracing dynamic control flow.",
        "torch._dynamo.exc.Unsupported: data dependent operator: aten._local_scalar_dense."
        "default; to enable, set torch._dynamo.config.capture_scalar_outputs = True",
        "Graph break in user code at /src/model.py:42\nReason: Unsupported: builtin: print "
        "[<class 'torch._dynamo.variables.constant.ConstantVariable'>] False",
    ),
    summary=(
        "torch.compile cannot trace {{location}} (`{{code_line}}`): {{reason}}.",
        "torch.compile cannot trace {{location}}: {{reason}}.",
        "torch.compile cannot trace part of the code: {{reason}}.",
        "torch.compile met code it cannot capture in a graph.",
    ),
    extract=_break_fields,
    causes=(
        Cause(
            "branch",
            "Python control flow on a tensor's value (if x.sum() > 0:, while loss > eps:): "
            "the graph would depend on the data.",
            weight=1,
            signals=(r"Data-dependent branching|generic_jump|jump with TensorVariable",),
            boost=12,
        ),
        Cause(
            "item",
            "A tensor turned into a Python number inside the compiled code (.item(), "
            ".tolist(), int(t), float(t)).",
            weight=1,
            signals=(r"\.item\(|_local_scalar_dense|tolist|capture_scalar_outputs",),
            boost=12,
        ),
        Cause(
            "print",
            "print() or logging inside the compiled code.",
            weight=1,
            signals=(r"\bprint\b|logging|logger",),
            boost=11,
        ),
        Cause(
            "unsupported_call",
            "A call Dynamo cannot trace: a builtin with unusual arguments, NumPy or PIL on "
            "tensors, a C extension without a registered custom op.",
            weight=1.5,
            signals=(r"builtin|numpy|C extension|skipfiles|Failed to trace|call_function",),
            boost=2,
        ),
        Cause(
            "dynamic_output",
            "An operation whose output shape depends on the data (nonzero, boolean-mask "
            "indexing, unique) inside the compiled code.",
            weight=0.5,
            signals=(r"nonzero|masked_select|DynamicOutputShape|unique",),
            boost=12,
        ),
    ),
    first_steps=(
        "List every graph break with its reason: `TORCH_LOGS=graph_breaks python train.py`, "
        "or torch._dynamo.explain(fn)(*args).",
        "Fix the breaks inside the hot path first; breaks at the edges of the compiled "
        "function cost little.",
    ),
    fixes=(
        Fix(
            "Branch with tensor operations instead of Python",
            "y = torch.where(x.sum() > 0, x + 1, x - 1)\n"
            "# or for larger branches: torch.cond(pred, true_fn, false_fn, (x,))",
            ("branch",),
        ),
        Fix(
            "Keep numbers as tensors; read them outside the compiled code",
            "out, loss = compiled_step(x, y)\nlog(loss.item())  # outside the compiled function",
            ("item", "print"),
        ),
        Fix(
            "Keep printing out of traced code",
            "if not torch.compiler.is_compiling():\n    print(x.shape)",
            ("print",),
        ),
        Fix(
            "Leave a helper out of the graph on purpose",
            "@torch.compiler.disable\ndef postprocess(x):\n    return numpy_heavy_code(x)",
            ("unsupported_call", "dynamic_output"),
        ),
        Fix(
            "Allow scalar outputs to be captured",
            "torch._dynamo.config.capture_scalar_outputs = True",
            ("item",),
        ),
    ),
)


def _recompile_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    limit = first(r"(?:cache_size_limit|recompile_limit) \((\d+)\)", message)
    if limit:
        f["limit"] = int(limit)
    function = first(r"function: '([^']+)'", text)
    if function:
        f["function"] = function
    reason = first(r"last reason: (.+?)\s*$", text)
    if reason:
        f["reason"] = reason
    return f


RECOMPILE = Entry(
    code="compile.recompile",
    title="torch.compile recompiles too often",
    meaning=(
        "Compiled code is guarded by assumptions (shapes, dtypes, Python values). When a "
        "guard fails, Dynamo compiles again; after the limit it gives up and runs the "
        "function eagerly. Each recompilation costs seconds to minutes."
    ),
    patterns=(
        r"hit config\.(?:cache_size_limit|recompile_limit)",
        r"torch\._dynamo hit config",
        r"(?:cache_size_limit|recompile_limit) \(\d+\)",
        r"Recompiling function",
    ),
    priority=2,
    examples=(
        "torch._dynamo hit config.recompile_limit (8)\n   function: 'forward' (model.py:31)\n"
        "   last reason: 0/7: tensor 'x' size mismatch at index 1. expected 128, actual 97",
    ),
    summary=(
        "{{function}} was recompiled {{limit}} times; last guard that failed: {{reason}}.",
        "A compiled function was recompiled until the limit.",
    ),
    extract=_recompile_fields,
    causes=(
        Cause(
            "shapes",
            "Input shapes change between calls (variable sequence lengths, a smaller last batch).",
            weight=2,
            signals=(r"size mismatch|stride mismatch|shape",),
            boost=3,
        ),
        Cause(
            "python_values",
            "A Python value that changes every call is baked into the graph (a learning "
            "rate, a step counter, a float argument).",
            weight=1,
            signals=(r"==|!=|ID_MATCH|EQUALS_MATCH|___check_obj_id",),
        ),
        Cause(
            "mode",
            "Switching between train() and eval(), or grad enabled and disabled, guards "
            "separately.",
            weight=0.5,
            signals=(r"training|grad_mode|GRAD_MODE",),
        ),
    ),
    first_steps=("See why each recompilation happens: `TORCH_LOGS=recompiles python train.py`.",),
    fixes=(
        Fix(
            "Compile for varying shapes",
            "model = torch.compile(model, dynamic=True)\n"
            "torch._dynamo.mark_dynamic(x, 1)  # or mark only the varying dimension",
            ("shapes",),
        ),
        Fix(
            "Pad to a few fixed sizes",
            "length = ((x.size(1) + 63) // 64) * 64\nx = F.pad(x, (0, 0, 0, length - x.size(1)))",
            ("shapes",),
        ),
        Fix(
            "Pass changing numbers as tensors",
            "lr = torch.tensor(0.01)  # instead of a Python float argument",
            ("python_values",),
        ),
    ),
)

BACKEND_FAILED = Entry(
    code="compile.backend_failed",
    title="torch.compile backend failed",
    meaning=(
        "Dynamo captured a graph but the compiler backend (Inductor by default) failed on "
        "it, or running the graph on fake tensors raised. The message after 'raised:' is the "
        "underlying error."
    ),
    patterns=(
        r"BackendCompilerFailed",
        r"\bInductorError\b",
        r"backend='\w+' raised",
        r"LoweringException",
        r"CppCompileError",
        r"TorchRuntimeError: (?:Failed running|Dynamo failed to run FX node)",
    ),
    priority=-5,
    examples=(
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\nCppCompileError: "
        "C++ compile error",
        "torch._inductor.exc.InductorError: LoweringException: AssertionError:",
    ),
    summary=(
        "The {{backend}} backend failed to compile the captured graph.",
        "The compiler backend failed on the captured graph.",
    ),
    extract=lambda message, text: (
        {"backend": b} if (b := first(r"backend='(\w+)'", f"{message}\n{text}")) else {}
    ),
    causes=(
        Cause(
            "toolchain",
            "The C++/CUDA toolchain Inductor needs is missing or broken (no compiler, no "
            "Python headers, an old gcc).",
            weight=0.5,
            signals=(r"CppCompileError|gcc|Python\.h|cc1plus|clang",),
            boost=12,
        ),
        Cause(
            "triton",
            "A generated Triton kernel needs more resources than the GPU has (shared "
            "memory) or Triton is missing.",
            weight=0.5,
            signals=(r"triton|OutOfResources",),
            boost=12,
        ),
        Cause(
            "model_error",
            "The model itself raises when traced (a shape or dtype error shows up as the "
            "underlying error).",
            weight=1,
            signals=(r"TorchRuntimeError|Failed running",),
            boost=12,
        ),
        Cause(
            "compiler_bug",
            "A bug in the compiler for this graph; bisect with other backends and report it.",
            weight=1,
        ),
    ),
    first_steps=(
        "Bisect: compile with backend='eager', then 'aot_eager', then 'inductor'; the first "
        "that fails names the layer at fault.",
        "Rerun with TORCHDYNAMO_VERBOSE=1 for the full internal traceback.",
    ),
    fixes=(
        Fix(
            "Bisect the backend",
            'model = torch.compile(model, backend="aot_eager")  # then "inductor"',
            ("compiler_bug", "model_error"),
        ),
        Fix(
            "Install a working toolchain",
            "apt-get install build-essential python3-dev  # gcc and Python headers",
            ("toolchain",),
        ),
        Fix(
            "Exclude the failing function for now",
            "@torch.compiler.disable\ndef problematic(x):\n    ...",
            ("triton", "compiler_bug"),
        ),
    ),
)

ENTRIES = (GRAPH_BREAK, RECOMPILE, BACKEND_FAILED)
