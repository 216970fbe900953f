// The functions of torchdoctor's compiled module that Python calls: defined in collectives.cpp,
// squares.cpp, phases.cpp (its PhaseTimer type) and steady.cpp (SteadyStep), made Python functions (with their
// signatures) in module.cpp, the one place that lists the boundary; torchdoctor/native/__init__.py's Kernels protocol is its typed
// Python side, and tests/unit/test_native.py checks that the two name the same parameters.
#pragma once

#include <Python.h>

namespace td {

// A type of the module, readied and added under `name` (false: an error is set).
inline bool add_type(PyObject* module, PyTypeObject* type, const char* name) {
  if (PyType_Ready(type) < 0) return false;
  Py_INCREF(type);
  if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(type)) < 0) {
    Py_DECREF(type);
    return false;
  }
  return true;
}

// collectives.cpp: the c10d kernels that record python.collectives
PyObject* register_ops(PyObject* self, PyObject* ops);
PyObject* unregister(PyObject* self, PyObject* unused);
PyObject* configure(PyObject* self, PyObject* args, PyObject* kwargs);
PyObject* enable(PyObject* self, PyObject* on);
PyObject* set_bounds(PyObject* self, PyObject* args);
PyObject* poll(PyObject* self, PyObject* errors);
PyObject* close_journal(PyObject* self, PyObject* unused);
PyObject* take_failure(PyObject* self, PyObject* unused);
void at_load();

// squares.cpp: the step's gradient norm, for the tensors it can read directly
PyObject* sum_of_squares(PyObject* self, PyObject* tensors);
PyObject* grad_squares(PyObject* self, PyObject* const* args, Py_ssize_t n);
PyObject* scalar_value(PyObject* self, PyObject* tensor);
// ... and for steady.cpp: grad_squares over an optimizer's param_groups (false: one cannot be
// read so), scalar_value's read
bool squares_of_groups(PyObject* groups, long long limit, double* total, Py_ssize_t* with_grad);
bool read_scalar(PyObject* tensor, double* out);

// phases.cpp: telemetry/phases.py's PhaseTimer as a type of the module (False: an error is set)
bool add_phase_timer(PyObject* module);
// ... and its operations for steady.cpp, on a timer is_phase_timer accepted (false, or -1 for
// phase_begin_forward: a Python error is set; its 1: the segment opened, 0: a nested call)
enum PhaseId { kPhaseData, kPhaseForward, kPhaseEvaluation, kPhaseBackward, kPhaseOptimizer };
bool is_phase_timer(PyObject* obj);
bool phase_enter(PyObject* timer, int phase, double now, PyObject* totals);
bool phase_exit(PyObject* timer, int phase, double now, PyObject* totals);
bool phase_inside(PyObject* timer, int phase);
int phase_begin_forward(PyObject* timer, double now, PyObject* totals, int segment_phase);
bool phase_end_forward(PyObject* timer, double now, PyObject* totals);
bool phase_step_ended(PyObject* timer, double now, PyObject* totals);

// steady.cpp: the steady step's handlers (telemetry/steady.py), the SteadyStep type
bool add_steady_step(PyObject* module);

}  // namespace td
