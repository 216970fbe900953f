// The functions of torchdoctor's compiled module that Python calls: defined in collectives.cpp,
// squares.cpp and phases.cpp (its PhaseTimer type), made Python functions (with their
// signatures) in module.cpp, the one place that lists the boundary; torchdoctor/native/__init__.py's Kernels protocol is its typed
// Python side, and tests/unit/test_native.py checks that the two name the same parameters.
#pragma once

#include <Python.h>

namespace td {

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
PyObject* group_squares(PyObject* self, PyObject* const* args, Py_ssize_t n);
PyObject* scalar_value(PyObject* self, PyObject* tensor);

// phases.cpp: telemetry/phases.py's PhaseTimer as a type of the module (False: an error is set)
bool add_phase_timer(PyObject* module);

}  // namespace td
