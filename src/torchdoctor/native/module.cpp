// torchdoctor's compiled module (torchdoctor.native._kernels): every function Python may call,
// with its signature (the first line of each docstring: inspect.signature reads it). What each
// does is said where it is defined (native.h).

#include "native.h"

namespace {

PyMethodDef kMethods[] = {
    {"register", td::register_ops, METH_O,
     "register($module, ops, /)\n--\n\n"
     "Register the c10d kernels for `ops`, a list of (c10d op, name in the table, inputs, group,\n"
     "peer, p2p, gathers) as telemetry/c10d_ops.py's OPS says (-1: no such argument); False\n"
     "when the dispatcher refused them."},
    {"unregister", td::unregister, METH_NOARGS,
     "unregister($module, /)\n--\n\nDrop the kernels (no call may be inside one)."},
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(td::configure)),
     METH_VARARGS | METH_KEYWORDS,
     "configure($module, /, *, step, journal, group, file_kind, backward_site)\n--\n\n"
     "A new run: what the kernel asks Python, each a callable (telemetry/collectives_native.py:\n"
     "KernelHost says when each is called); the groups are described again."},
    {"enable", td::enable, METH_O,
     "enable($module, on, /)\n--\n\nRecord calls (True), or pass them straight on."},
    {"set_bounds", td::set_bounds, METH_VARARGS,
     "set_bounds($module, works, nbytes, /)\n--\n\n"
     "Past this many works held for polling, or bytes of their tensors, the caller polls."},
    {"poll", td::poll, METH_O,
     "poll($module, errors, /)\n--\n\n"
     "End the calls whose works completed (failed ones as such with `errors`); the number\n"
     "still pending. Lets the GIL go while it polls."},
    {"close", td::close_journal, METH_NOARGS,
     "close($module, /)\n--\n\nThe run's end: the journal closed, nothing written after."},
    {"take_failure", td::take_failure, METH_NOARGS,
     "take_failure($module, /)\n--\n\nWhat turned recording off, once ('' if nothing did)."},
    {"sum_of_squares", td::sum_of_squares, METH_O,
     "sum_of_squares($module, tensors, /)\n--\n\n"
     "The sum of the squares of every element of a list of CPU, dense, contiguous float32,\n"
     "float64, bfloat16 or float16 tensors, accumulated in double; None for anything else."},
    {"grad_squares", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(td::grad_squares)),
     METH_FASTCALL,
     "grad_squares($module, params, limit, /)\n--\n\n"
     "(the sum of the squares of the gradients of a list of Tensors or Parameters, how many\n"
     "have one), read as sum_of_squares reads; None when one cannot be read so or they hold\n"
     "more than `limit` elements."},
    {"scalar_value", td::scalar_value, METH_O,
     "scalar_value($module, tensor, /)\n--\n\n"
     "The value of a one-element tensor as .item() gives it, read in place; None for one\n"
     "sum_of_squares could not read."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "torchdoctor's compiled part: the c10d kernels of python.collectives, sum_of_squares,\n"
    "PhaseTimer, SteadyStep.", -1,
    kMethods,
};

}  // namespace

PyMODINIT_FUNC PyInit__kernels() {
  td::at_load();
  PyObject* module = PyModule_Create(&kModule);
  if (module != nullptr && !(td::add_phase_timer(module) && td::add_steady_step(module))) {
    Py_CLEAR(module);
  }
  return module;
}
