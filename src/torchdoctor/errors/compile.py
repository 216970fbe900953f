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
        r"Dynamic control flow is not supported",
        r"(?:^|\s)Unsupported: (?:call_function|comparison|builtin|Skip calling|Attempted|"
        r"generic_jump|torch\.\*|dynamic shape)",
        r"\[__graph_breaks\]",
    ),
    keys=(r"torch\._dynamo\.exc\.\w+", r"\bdynamo\b.*\bUnsupported\b"),
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
            signals=(
                r"Data-dependent branching|generic_jump|jump with TensorVariable"
                r"|Dynamic control flow",
            ),
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
    limit = first(r"(?:cache_size_limit|recompile_limit) \((\d+)\)", f"{message}\n{text}")
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
        r"FailOnRecompileLimitHit",
        r"recompile_limit reached with (?:fullgraph|one_graph)=True",
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
        r"\bTritonMissing\b",
        r"Cannot find a working triton installation",
    ),
    keys=(r"torch\._inductor\.exc\.\w+",),
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
            "triton_missing",
            "Triton is not installed in the Python that runs the program, or it is too old "
            "for this torch (on Windows it is the separate triton-windows package); Inductor "
            "needs it for GPU code. A GPU older than compute capability 7.0 is not "
            "supported by Triton either.",
            weight=0.5,
            signals=(r"TritonMissing|Cannot find a working triton",),
            boost=30,
        ),
        Cause(
            "triton",
            "A generated Triton kernel needs more resources than the GPU has (shared memory).",
            weight=0.5,
            signals=(r"OutOfResources|triton\.(?:runtime|compiler)",),
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
            "Install the Triton that matches this torch, in the Python that runs the program",
            "python -m pip install -U triton            # Linux: the version torch pins\n"
            "python -m pip install -U triton-windows    # Windows\n"
            '# or skip Inductor meanwhile: torch.compile(model, backend="aot_eager")',
            ("triton_missing",),
        ),
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


def _guard_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    expr = first(
        r"Could not guard on data-dependent expression (.+?)(?:\s+\(unhinted|\.\s|$)", message
    ) or first(
        r"Could not extract specialized integer from data-dependent "
        r"expression (\S+)",
        message,
    )
    if expr:
        f["expression"] = expr.strip()
    culprit = first(r"Caused by: .*?\((\S+:\d+) in (\w+)\)", text) or first(
        r"Caused by: \((\S+:\d+) in \w+\)", text
    )
    if culprit:
        f["culprit"] = culprit
    if first(r"(torch\.export\.export|_export_to_torch_ir|torch\.onnx|executorch)", text):
        f["exporter"] = "export"
    return f


DATA_DEPENDENT = Entry(
    code="export.data_dependent",
    title="torch.export: a guard on a data-dependent value",
    meaning=(
        "torch.export (and torch.compile with fullgraph, ONNX's dynamo exporter, ExecuTorch) "
        "traces with symbolic values. A value that comes from the data (the result of "
        ".item(), nonzero(), a mask's count: an unbacked symbol u0, u1, ...) was used where a "
        "concrete answer is needed (an if, a size check, a view), and the tracer cannot know "
        "which branch the data will take."
    ),
    patterns=(
        r"Could not guard on data-dependent expression",
        r"GuardOnDataDependentSymNode",
        r"Could not extract specialized integer from data-dependent expression",
        r"data-dependent expression \w+\(u\d+",
        r"Tried to use data-dependent value in the subsequent computation",
    ),
    keys=(r"data-dependent expression", r"unbacked symbol"),
    priority=4,
    examples=(
        "torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode: Could not guard "
        "on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1)).  (Size-like symbols: "
        "none)",
    ),
    summary=(
        "The tracer needs to decide {{expression}}, which depends on the data ({{culprit}}).",
        "The tracer needs to decide {{expression}}, which depends on the data.",
        "The tracer met a decision that depends on the data.",
    ),
    extract=_guard_fields,
    causes=(
        Cause(
            "branch_on_data",
            "The model branches on, or checks, a value computed from the data (if mask.any(), "
            "a size from nonzero(), a count from .item()).",
            weight=2,
        ),
        Cause(
            "library_check",
            (
                "A library's own check, not your code, asks the question ({{culprit}}): a "
                "size-0 or size-1 test in a framework function that could use "
                "guard_size_oblivious.",
                "A library's own check, not your code, asks the question (a size-0 or size-1 "
                "test in a framework function).",
            ),
            weight=1,
            signals=(r"Potential framework code culprit|guard_size_oblivious|_meta_registrations",),
            boost=2,
        ),
        Cause(
            "quantization",
            "An observer or quantization step computes values from the data at trace time.",
            weight=0.3,
            signals=(r"activation_post_process|observer|quantiz",),
            boost=5,
        ),
    ),
    first_steps=(
        'Find the line: rerun with TORCH_LOGS="+dynamic" and '
        "TORCHDYNAMO_EXTENDED_DEBUG_GUARD_ADDED=\"<the expression>\"; the 'User Stack' and "
        "'Caused by' lines point at it.",
    ),
    fixes=(
        Fix(
            "Tell the tracer what it cannot know",
            "n = mask.sum().item()\n"
            "torch._check(n > 1)          # or torch._check_is_size(n)\n"
            "# branches on data: torch.cond(pred, true_fn, false_fn, (x,))",
            ("branch_on_data", "library_check"),
        ),
        Fix(
            "Compute data-dependent values outside the exported function",
            "lengths = mask.sum(1)         # before export, passed in as an input\n"
            "ep = torch.export.export(model, (x, lengths))",
            ("branch_on_data", "quantization"),
        ),
    ),
)

ENTRIES = (GRAPH_BREAK, RECOMPILE, BACKEND_FAILED, DATA_DEPENDENT)
