// SteadyStep: the steady step's handlers (telemetry/steady.py says what a steady step is).
//
// Most steps of a run are alike, and their bookkeeping in Python cost about 1,200 opcodes and
// 38 calls into torchdoctor a step: on a tiny CPU model, over the fixed cost's budget
// (docs/benchmarks.md). Here each torch event of such a step is one call from its hook
// (telemetry/torch_hooks.py), which does in C++ what the Recorder's general path would do, on
// the same objects: the StepState, its phases dict (through the compiled PhaseTimer), the rows'
// table. Each handler first tests, without writing anything, whether the event is the ordinary
// one; if not it answers False and the hook calls the general path instead, which is then the
// only one that saw it. So the rows are the same either way (tests/unit/test_steady_step.py runs
// each loop both ways).
//
// While no torch.compile is in use, the hooks themselves are here too (pre_hook, post_hook,
// optimizer_pre_hook, optimizer_post_hook, and the Backward standing for
// torch.autograd.backward): torch calls them with no Python frame between.
//
// The attributes the handlers use are interned once (TD_STEADY_NAMES); kUses lists those of
// the Recorder's parts, and SteadyStep.names lets a test check each against a real Recorder.

#include "native.h"
#include "steps_layout.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace {

// Every attribute the handlers touch, interned once: name.<x> is the Python string "x".
#define TD_STEADY_NAMES(X)                                                                \
  /* the Recorder, and what it calls */                                                   \
  X(steady) X(state) X(memory_at_setup) X(next_rank_poll) X(step) X(steps_done)           \
  X(skipped_steps) X(rank) X(compiled) X(host) X(switch_) X(train_thread) X(on) X(fail)   \
  X(on_model_call) X(on_backward) X(on_backward_done) X(_is_compiling_flag)               \
  /* its parts' */                                                                        \
  X(active) X(tracing) X(shaping) X(discovering) X(hooks_on) X(requested) X(next_step)    \
  X(depth) X(generator) X(last_walk) X(call_site) X(loss_site) X(pending) X(several)      \
  X(closure_checked) X(open) X(begin) X(end) X(cuda) X(steps) X(append) X(last) X(latest) \
  X(read) X(drain) X(config) X(trace_every) X(quiet_until) X(on_step_end)                 \
  /* the step in progress (StepState) */                                                  \
  X(tape) X(rng) X(autocast) X(grad_enabled) X(phases) X(start) X(losses) X(loss_ref)     \
  X(backward_site) X(scaled) X(micro) X(clip_norm) X(grad_norm) X(grad_norm_value)        \
  X(update) X(skip) X(claimed) X(closure_losses)                                          \
  /* torch's objects */                                                                   \
  X(training) X(get_state) X(param_groups) X(lr)                                          \
  /* the phases' columns */                                                               \
  X(data_wait) X(forward) X(backward) X(optimizer) X(evaluation)

struct Names {
#define TD_FIELD(n) PyObject* n;
  TD_STEADY_NAMES(TD_FIELD)
#undef TD_FIELD
};
Names name;

// The Python name of each attribute (switch_ is `switch`, a keyword in C++).
const char* python_name(const char* field) {
  return std::strcmp(field, "switch_") == 0 ? "switch" : field;
}

PyObject* one;    // the int 1
PyObject* empty;  // ()

namespace col = steps::column;  // python.steps' columns by name (steps_layout.h, layout.py)
constexpr Py_ssize_t kRowSize = steps::kColumns;
static_assert(kRowSize == 20, "a python.steps column that step_row does not fill");
static_assert(col::optimizer == col::data_wait + 3 && col::rss == col::allocated + 3,
              "step_row fills the phases and the memory figures as runs of four columns");

struct Steady {
  PyObject_HEAD
  PyObject* rec;
  // the Recorder's parts, each made once with it (recorder.py)
  PyObject* timer;
  PyObject* silent;
  PyObject* plan;
  PyObject* roots;
  PyObject* optimizers;
  PyObject* rows;
  PyObject* memory;
  PyObject* safe_point;
  PyObject* listeners;
  // what telemetry/steady.py's Parts hands over
  PyObject* row_type;      // python.steps' row (a named tuple)
  PyObject* state_type;    // StepState
  PyObject* after;         // steady.after(rec): whether the next step is steady
  PyObject* learning_rate; // optimizers.learning_rate(optimizer)
  PyObject* autocast_now;  // step.autocast_now(torch)
  PyObject* any_autocast;  // torch._C._is_any_autocast_enabled, or None
  PyObject* torch;
  PyObject* export_flags;  // invisible.export_flags: its _is_compiling_flag while torch.export runs
  PyObject* switch_;       // the Recorder's Switch
  PyObject* updates;       // the Recorder's Updates (the general way of optimizer.step())
  PyObject* sum;           // builtins.sum: the losses' mean as Python adds them
  PyObject* zero_phases;   // phases.zero(): a new StepState's phases are its copy
  long long limit;         // gradient elements squares_of_groups reads (gradients.NATIVE_MAX)
  Py_ssize_t tape_limit;   // model calls kept for a NaN replay (step.TAPE_LIMIT)
  long long steps;         // steps ended here
  long long optimizer_calls;  // optimizer.step() calls through optimizer_pre_hook
};

// -- small helpers (each returns a new reference, or nullptr with an error set) -----------------

PyObject* get(PyObject* obj, PyObject* attr) { return PyObject_GetAttr(obj, attr); }

// The truth of obj.attr: 1, 0, or -1 with an error set.
int truth(PyObject* obj, PyObject* attr) {
  PyObject* value = PyObject_GetAttr(obj, attr);
  if (value == nullptr) return -1;
  int out = PyObject_IsTrue(value);
  Py_DECREF(value);
  return out;
}

// obj.attr is None: 1, 0, or -1.
int is_none(PyObject* obj, PyObject* attr) {
  PyObject* value = PyObject_GetAttr(obj, attr);
  if (value == nullptr) return -1;
  int out = value == Py_None;
  Py_DECREF(value);
  return out;
}

bool set(PyObject* obj, PyObject* attr, PyObject* value) {
  return PyObject_SetAttr(obj, attr, value) == 0;
}

// obj.attr = value, stealing value (nullptr: its error stands).
bool set_new(PyObject* obj, PyObject* attr, PyObject* value) {
  if (value == nullptr) return false;
  bool ok = set(obj, attr, value);
  Py_DECREF(value);
  return ok;
}

// time.perf_counter() and time.time(), as Python reads them.
double perf_counter() {
#if PY_VERSION_HEX >= 0x030D0000
  PyTime_t t;
  PyTime_PerfCounterRaw(&t);
  return PyTime_AsSecondsDouble(t);
#else
  return _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());
#endif
}

double wall_time() {
#if PY_VERSION_HEX >= 0x030D0000
  PyTime_t t;
  PyTime_TimeRaw(&t);
  return PyTime_AsSecondsDouble(t);
#else
  return _PyTime_AsSecondsDouble(_PyTime_GetSystemClock());
#endif
}

// StepState.start = now, where the step has not started yet (false: an error is set).
bool start_once(PyObject* state, double now) {
  int fresh = is_none(state, name.start);
  return fresh >= 0 && (fresh == 0 || set_new(state, name.start, PyFloat_FromDouble(now)));
}

// The Recorder's steady flag holds `optimizer`'s weak reference (or any, with optimizer null):
// 1, 0, or -1.
int steady_for(Steady* s, PyObject* optimizer) {
  PyObject* ref = get(s->rec, name.steady);
  if (ref == nullptr) return -1;
  int out = 0;
  if (ref != Py_None) {
    if (optimizer == nullptr) {
      out = 1;
    } else if (PyWeakref_Check(ref)) {
      out = PyWeakref_GetObject(ref) == optimizer;  // borrowed
    }
  }
  Py_DECREF(ref);
  return out;
}

bool plain_tensor(PyObject* obj) {
  return Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(THPVariableClass);
}

PyObject* answer(int handled) {
  if (handled < 0) return nullptr;
  return PyBool_FromLong(handled);
}

// -- the loss's line -----------------------------------------------------------------------------

// ModelRoots.loss_site(frame) for `frame`, the one that called torch.autograd.backward (a new
// reference, or nullptr): the last walk's answer when the frames are the same code and the same
// offset, else Python's walk.
PyObject* loss_site(Steady* s, PyFrameObject* frame) {
  if (frame == nullptr) return get(s->roots, name.call_site);
  Py_INCREF(frame);
  PyObject* out = nullptr;
#if PY_VERSION_HEX >= 0x030B0000
  PyObject* walk = get(s->roots, name.last_walk);
  if (walk == nullptr) {
    Py_DECREF(frame);
    return nullptr;
  }
  if (PyTuple_Check(walk) && PyTuple_GET_SIZE(walk) == 6) {
    PyObject* code = PyTuple_GET_ITEM(walk, 0);
    long up = PyLong_AsLong(PyTuple_GET_ITEM(walk, 1));
    PyObject* found = PyTuple_GET_ITEM(walk, 2);
    int mine = PyObject_IsTrue(PyTuple_GET_ITEM(walk, 3));
    long lasti = PyLong_AsLong(PyTuple_GET_ITEM(walk, 4));
    PyErr_Clear();
    PyCodeObject* frame_code = PyFrame_GetCode(frame);
    bool same = reinterpret_cast<PyObject*>(frame_code) == code;
    Py_DECREF(frame_code);
    if (same) {
      PyFrameObject* caller = frame;
      Py_INCREF(caller);
      for (long k = 0; k < up && caller != nullptr; ++k) {
        PyFrameObject* back = PyFrame_GetBack(caller);
        Py_DECREF(caller);
        caller = back;
      }
      if (caller != nullptr) {
        PyCodeObject* caller_code = PyFrame_GetCode(caller);
        if (reinterpret_cast<PyObject*>(caller_code) == found) {
          PyObject* call_site = get(s->roots, name.call_site);
          if (call_site == nullptr) {
            Py_DECREF(caller_code);
            Py_DECREF(caller);
            Py_DECREF(walk);
            Py_DECREF(frame);
            return nullptr;
          }
          if (!(mine == 1 || call_site == Py_None)) {
            out = call_site;  // a library's backward(): the model's caller
          } else {
            Py_DECREF(call_site);
            if (PyFrame_GetLasti(caller) == lasti) {
              out = PyTuple_GET_ITEM(walk, 5);
              Py_INCREF(out);
            }
          }
        }
        Py_DECREF(caller_code);
        Py_DECREF(caller);
      }
    }
  }
  Py_DECREF(walk);
#endif
  if (out == nullptr) {
    out = PyObject_CallMethodOneArg(s->roots, name.loss_site, reinterpret_cast<PyObject*>(frame));
  }
  Py_DECREF(frame);
  return out;
}

// -- the handlers ------------------------------------------------------------------------------

// A model's forward pre-hook (Recorder.on_model_call): the step's first call kept for a NaN
// replay with the state it ran in, the forward (or evaluation) phase opened.
int model_call(Steady* s, PyObject* module, PyObject* args, PyObject* kwargs) {
  int ok = steady_for(s, nullptr);
  if (ok <= 0) return ok;
  int active = truth(s->silent, name.active);  // the silent checks look at this call
  if (active != 0) return active < 0 ? -1 : 0;
  // (nn.Module's __getattr__ makes PyObject_GetAttr go through a slot: `training` is found
  // the generic way, as Python finds it first)
  PyObject* training = PyObject_GenericGetAttr(module, name.training);
  if (training == nullptr) {
    PyErr_Clear();
    return 0;
  }
  int train = training == Py_True;
  Py_DECREF(training);
  if (!train) return 0;  // an evaluation call: the silent checks see those
  int setup = truth(s->rec, name.memory_at_setup);
  if (setup <= 0) return setup;

  double now = perf_counter();
  bool grad = at::GradMode::is_enabled();
  PyObject* state = get(s->rec, name.state);
  if (state == nullptr) return -1;
  PyObject* tape = get(state, name.tape);
  PyObject* phases = get(state, name.phases);
  bool done = false;
  if (tape != nullptr && phases != nullptr && PyList_Check(tape)) {
    Py_ssize_t kept = PyList_GET_SIZE(tape);
    done = true;
    if (kept == 0) {  // StepState.keep_call's first call: the random state, the autocast
      PyObject* generator = get(s->roots, name.generator);
      done = generator != nullptr;
      if (done && generator != Py_None) {
        PyObject* rng = PyObject_CallMethodNoArgs(generator, name.get_state);
        done = rng != nullptr && set_new(state, name.rng, PyTuple_Pack(2, generator, rng));
        Py_XDECREF(rng);
      }
      Py_XDECREF(generator);
      if (done) {
        int any = 1;
        if (s->any_autocast != Py_None) {
          PyObject* on = PyObject_CallNoArgs(s->any_autocast);
          any = on == nullptr ? -1 : PyObject_IsTrue(on);
          Py_XDECREF(on);
        }
        PyObject* contexts = any < 0   ? nullptr
                             : any == 0 ? PyList_New(0)
                                        : PyObject_CallOneArg(s->autocast_now, s->torch);
        done = set_new(state, name.autocast, contexts) &&
               set(state, name.grad_enabled, grad ? Py_True : Py_False);
      }
    }
    if (done && kept < s->tape_limit) {
      PyObject* call = PyTuple_Pack(3, module, args, kwargs);
      done = call != nullptr && PyList_Append(tape, call) == 0;
      Py_XDECREF(call);
    }
    if (done) {
      int opened = td::phase_begin_forward(s->timer, now, phases,
                                           grad ? td::kPhaseForward : td::kPhaseEvaluation);
      done = opened >= 0;
      if (opened == 1) done = start_once(state, now);
    }
  } else if (tape != nullptr && phases != nullptr) {
    PyErr_SetString(PyExc_TypeError, "StepState.tape is not a list");
  }
  Py_XDECREF(tape);
  Py_XDECREF(phases);
  Py_DECREF(state);
  return done ? 1 : -1;
}

// A model's forward hook (Recorder.on_model_return): the forward phase closes. Every step.
PyObject* model_return(Steady* s) {
  double now = perf_counter();
  PyObject* state = get(s->rec, name.state);
  if (state == nullptr) return nullptr;
  PyObject* phases = get(state, name.phases);
  Py_DECREF(state);
  if (phases == nullptr) return nullptr;
  bool ok = td::phase_end_forward(s->timer, now, phases);
  Py_DECREF(phases);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// backward() on the steady step's loss (Recorder.on_backward): its value read in place, its
// line, the backward phase opened.
int backward(Steady* s, PyObject* tensors, PyFrameObject* caller) {
  int ok = steady_for(s, nullptr);
  if (ok <= 0) return ok;
  if (!plain_tensor(tensors) || td::phase_inside(s->timer, td::kPhaseOptimizer)) return 0;
  double value;
  if (!td::read_scalar(tensors, &value)) return 0;  // also: not one element
  PyObject* state = get(s->rec, name.state);
  if (state == nullptr) return -1;
  int plain = is_none(state, name.scaled);  // GradScaler's scaled loss: the general way
  if (plain <= 0) {
    Py_DECREF(state);
    return plain;
  }
  double now = perf_counter();
  PyObject* site = loss_site(s, caller);
  PyObject* phases = site == nullptr ? nullptr : get(state, name.phases);
  PyObject* losses = phases == nullptr ? nullptr : get(state, name.losses);
  bool done = losses != nullptr && PyList_Check(losses);
  if (done) {
    done = start_once(state, now) && td::phase_enter(s->timer, td::kPhaseBackward, now, phases) &&
           set(state, name.loss_ref, tensors) && set(state, name.backward_site, site);
    if (done) {
      PyObject* loss = PyFloat_FromDouble(value);
      done = loss != nullptr && PyList_Append(losses, loss) == 0;
      Py_XDECREF(loss);
    }
  } else if (losses != nullptr) {
    PyErr_SetString(PyExc_TypeError, "StepState.losses is not a list");
  }
  Py_XDECREF(losses);
  Py_XDECREF(phases);
  Py_XDECREF(site);
  Py_DECREF(state);
  return done ? 1 : -1;
}

// backward() returned (Recorder.on_backward_done): the phase closes; nothing more to see when
// the loss was finite.
int backward_done(Steady* s) {
  int ok = steady_for(s, nullptr);
  if (ok <= 0) return ok;
  if (td::phase_inside(s->timer, td::kPhaseOptimizer)) return 0;  // a closure in step()
  PyObject* state = get(s->rec, name.state);
  if (state == nullptr) return -1;
  PyObject* losses = get(state, name.losses);
  PyObject* micro = losses == nullptr ? nullptr : get(state, name.micro);
  int out = -1;
  if (micro != nullptr && PyList_Check(losses)) {
    Py_ssize_t n = PyList_GET_SIZE(losses);
    PyObject* last = n ? PyList_GET_ITEM(losses, n - 1) : nullptr;
    if (last != nullptr && PyFloat_CheckExact(last) && !std::isfinite(PyFloat_AS_DOUBLE(last))) {
      out = 0;  // a non-finite loss: the general way names it
    } else {
      double now = perf_counter();
      PyObject* phases = get(state, name.phases);
      PyObject* more = phases == nullptr ? nullptr : PyNumber_Add(micro, one);
      bool done = more != nullptr && td::phase_exit(s->timer, td::kPhaseBackward, now, phases) &&
                  set(state, name.micro, more);
      Py_XDECREF(more);
      Py_XDECREF(phases);
      out = done ? 1 : -1;
    }
  } else if (micro != nullptr) {
    PyErr_SetString(PyExc_TypeError, "StepState.losses is not a list");
  }
  Py_XDECREF(micro);
  Py_XDECREF(losses);
  Py_DECREF(state);
  return out;
}

// Optimizers.open, the updates in progress (id -> (began, check)): a new reference to the
// dict, or nullptr with an error set.
PyObject* open_updates(Steady* s) {
  PyObject* open = get(s->optimizers, name.open);
  if (open != nullptr && !PyDict_Check(open)) {
    PyErr_SetString(PyExc_TypeError, "Optimizers.open is not a dict");
    Py_CLEAR(open);
  }
  return open;
}

// The primary's optimizer.step() begins (Updates.begin): its gradient norm, from the norm
// clip_grad_norm_ returned or read in C++ from its param_groups; the optimizer phase opens.
int optimizer_pre(Steady* s, PyObject* optimizer) {
  int ok = steady_for(s, optimizer);
  if (ok <= 0) return ok;
  PyObject* state = get(s->rec, name.state);
  if (state == nullptr) return -1;
  PyObject* clip = get(state, name.clip_norm);
  if (clip == nullptr) {
    Py_DECREF(state);
    return -1;
  }
  double value = 0;
  PyObject* norm = nullptr;  // what StepState.grad_norm holds: the clip's tensor, or the value
  bool read = false;
  if (clip == Py_None) {
    PyObject* groups = get(optimizer, name.param_groups);
    double squares;
    Py_ssize_t with_grad;
    if (groups == nullptr) {
      PyErr_Clear();
    } else if (td::squares_of_groups(groups, s->limit, &squares, &with_grad) && with_grad) {
      value = std::sqrt(squares);
      read = true;
    }
    Py_XDECREF(groups);
  } else if (plain_tensor(clip) && td::read_scalar(clip, &value)) {
    norm = clip;
    Py_INCREF(norm);
    read = true;
  }
  Py_DECREF(clip);
  if (!read || !std::isfinite(value)) {  // no gradient, one not read so, or not finite
    Py_XDECREF(norm);
    Py_DECREF(state);
    return 0;
  }
  double now = perf_counter();
  PyObject* value_obj = PyFloat_FromDouble(value);
  if (norm == nullptr && value_obj != nullptr) {
    norm = value_obj;
    Py_INCREF(norm);
  }
  PyObject* phases = value_obj == nullptr ? nullptr : get(state, name.phases);
  bool done = false;
  if (phases != nullptr) {
    done = start_once(state, now) && td::phase_enter(s->timer, td::kPhaseOptimizer, now, phases) &&
           set(s->optimizers, name.closure_checked, Py_False) &&
           set(state, name.grad_norm, norm) && set(state, name.grad_norm_value, value_obj);
    if (done) {  // Optimizers.begin(optimizer, now, None): open[id(optimizer)] = (now, None)
      PyObject* open = open_updates(s);
      PyObject* key = open == nullptr ? nullptr : PyLong_FromVoidPtr(optimizer);
      PyObject* opened = key == nullptr ? nullptr : Py_BuildValue("(dO)", now, Py_None);
      done = opened != nullptr && PyDict_SetItem(open, key, opened) == 0;
      Py_XDECREF(opened);
      Py_XDECREF(key);
      Py_XDECREF(open);
    }
  }
  Py_XDECREF(phases);
  Py_XDECREF(value_obj);
  Py_XDECREF(norm);
  Py_DECREF(state);
  return done ? 1 : -1;
}

// Whether the step that the primary's update ends now can be ended here: 1, 0 (the general
// way: a rank poll due, tracing, discovery, a second optimizer, a closure's losses, a GPU), -1.
int plain_end(Steady* s, PyObject* state, double now) {
  PyObject* poll = get(s->rec, name.next_rank_poll);
  if (poll == nullptr) return -1;
  double next_poll = PyFloat_AsDouble(poll);
  Py_DECREF(poll);
  if (next_poll == -1.0 && PyErr_Occurred()) return -1;
  if (now >= next_poll) return 0;
  PyObject* const checks[][2] = {
      {s->plan, name.tracing},      {s->plan, name.shaping}, {s->plan, name.discovering},
      {s->roots, name.pending},     {s->rows, name.cuda},    {s->optimizers, name.several},
      {state, name.claimed},        {state, name.closure_losses},
  };
  for (const auto& check : checks) {
    int on = truth(check[0], check[1]);
    if (on != 0) return on < 0 ? -1 : 0;
  }
  return 1;
}

// The python.steps row of a finished step (StepRows.step, on the CPU, one optimizer).
PyObject* step_row(Steady* s, PyObject* state, PyObject* optimizer, double end, PyObject* step) {
  PyObject* items[kRowSize] = {};
  PyObject* phases = get(state, name.phases);
  PyObject* start = phases == nullptr ? nullptr : get(state, name.start);
  PyObject* losses = start == nullptr ? nullptr : get(state, name.losses);
  PyObject* memory = losses == nullptr ? nullptr : get(s->memory, name.latest);
  if (memory == Py_None) {  // no sample yet: read now
    Py_DECREF(memory);
    memory = PyObject_CallMethodNoArgs(s->memory, name.read);
  }
  bool ok = memory != nullptr && PyDict_Check(phases) && PyList_Check(losses) &&
            PyTuple_Check(memory) && PyTuple_GET_SIZE(memory) == 4;
  if (memory != nullptr && !ok && !PyErr_Occurred()) {
    PyErr_SetString(PyExc_TypeError, "the step's phases, losses or memory are not as expected");
  }
  if (ok) {
    double begun = start == Py_None ? end : PyFloat_AsDouble(start);
    double duration = std::max(0.0, end - begun);
    double booked = 0;  // sum(phases.values()), in the dict's order
    Py_ssize_t pos = 0;
    PyObject *key, *seconds;
    while (ok && PyDict_Next(phases, &pos, &key, &seconds)) {
      booked += PyFloat_AsDouble(seconds);
      ok = !PyErr_Occurred();
    }
    const std::pair<int, PyObject*> columns[] = {
        {col::data_wait, name.data_wait}, {col::forward, name.forward},
        {col::backward, name.backward},   {col::optimizer, name.optimizer},
        {col::evaluation, name.evaluation}};
    for (const auto& [column, key] : columns) {
      PyObject* seconds = ok ? PyDict_GetItemWithError(phases, key) : nullptr;  // borrowed
      ok = seconds != nullptr;
      Py_XINCREF(seconds);
      items[column] = seconds;
    }
    if (!ok && !PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "a phase of python.steps");
    items[col::step] = step;
    Py_INCREF(step);
    items[col::time] = PyFloat_FromDouble(wall_time());
    items[col::duration] = PyFloat_FromDouble(duration);
    items[col::other] = PyFloat_FromDouble(std::max(0.0, duration - booked));
    Py_ssize_t n = PyList_GET_SIZE(losses);
    PyObject* first = n == 1 ? PyList_GET_ITEM(losses, 0) : nullptr;
    if (first != nullptr && PyFloat_CheckExact(first)) {  // sum([x]) / 1, as Python adds it
      items[col::loss] = PyFloat_FromDouble((0.0 + PyFloat_AS_DOUBLE(first)) / 1.0);
    } else if (n) {  // sum(losses) / len(losses): Python's own sum, as the general way adds
      PyObject* total = PyObject_CallOneArg(s->sum, losses);
      PyObject* count = total == nullptr ? nullptr : PyLong_FromSsize_t(n);
      items[col::loss] = count == nullptr ? nullptr : PyNumber_TrueDivide(total, count);
      Py_XDECREF(count);
      Py_XDECREF(total);
    } else {
      items[col::loss] = Py_None;
      Py_INCREF(Py_None);
    }
    items[col::grad_norm] = get(state, name.grad_norm_value);
    // learning_rate(optimizer): a float in the first group most steps
    PyObject* groups = get(optimizer, name.param_groups);
    PyObject* group = groups != nullptr && PyList_Check(groups) && PyList_GET_SIZE(groups)
                          ? PyList_GET_ITEM(groups, 0)
                          : nullptr;
    PyObject* lr = group != nullptr && PyDict_CheckExact(group)
                       ? PyDict_GetItemWithError(group, name.lr)
                       : nullptr;
    if (lr != nullptr && PyFloat_CheckExact(lr)) {
      Py_INCREF(lr);
      items[col::lr] = lr;
    } else {
      PyErr_Clear();
      items[col::lr] = PyObject_CallOneArg(s->learning_rate, optimizer);
    }
    Py_XDECREF(groups);
    for (int k = 0; k < 4; ++k) {  // allocated, max_allocated, reserved, rss
      items[col::allocated + k] = PyTuple_GET_ITEM(memory, k);
      Py_INCREF(items[col::allocated + k]);
    }
    items[col::rank] = get(s->rec, name.rank);
    items[col::micro_batches] = get(state, name.micro);
    items[col::skipped] = get(state, name.skip);
    items[col::traced] = get(s->plan, name.tracing);
  }
  Py_XDECREF(memory);
  Py_XDECREF(losses);
  Py_XDECREF(start);
  Py_XDECREF(phases);
  for (PyObject* item : items) ok = ok && item != nullptr;
  // a StepRow made as tuple.__new__ makes it, without the named tuple's __new__
  PyObject* row = ok ? reinterpret_cast<PyTypeObject*>(s->row_type)
                           ->tp_alloc(reinterpret_cast<PyTypeObject*>(s->row_type), kRowSize)
                     : nullptr;
  for (Py_ssize_t k = 0; k < kRowSize; ++k) {
    if (row != nullptr) {
      PyTuple_SET_ITEM(row, k, items[k]);  // steals
    } else {
      Py_XDECREF(items[k]);
    }
  }
  return row;
}

// Optimizers.end(optimizer, now) for the primary of a steady step: open.pop(id(optimizer),
// (now, None)) (its `_fresh` is empty while there is one optimizer).
PyObject* end_update(Steady* s, PyObject* optimizer, PyObject* now) {
  PyObject* open = open_updates(s);
  if (open == nullptr) return nullptr;
  PyObject* key = PyLong_FromVoidPtr(optimizer);
  PyObject* out = key == nullptr ? nullptr : PyDict_GetItemWithError(open, key);  // borrowed
  if (out != nullptr) {
    Py_INCREF(out);
    if (PyDict_DelItem(open, key) != 0) Py_CLEAR(out);
  } else if (key != nullptr && !PyErr_Occurred()) {
    out = PyTuple_Pack(2, now, Py_None);
  }
  Py_XDECREF(key);
  Py_DECREF(open);
  return out;
}

// StepState(start) as its __init__ makes it, without the call: its five instance attributes
// (step.py; a test compares the two).
PyObject* new_state(Steady* s, PyObject* start) {
  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(s->state_type);
  PyObject* state = PyBaseObject_Type.tp_new(type, empty, nullptr);
  bool ok = state != nullptr && set(state, name.start, start) &&
            set_new(state, name.phases, PyDict_Copy(s->zero_phases)) &&
            set_new(state, name.losses, PyList_New(0)) &&
            set_new(state, name.closure_losses, PyList_New(0)) &&
            set_new(state, name.tape, PyList_New(0));
  if (!ok) Py_CLEAR(state);
  return state;
}

// The primary's optimizer.step() returned (Updates.end, Recorder.end_step and _finish): the
// step's row, then the next step set up.
int optimizer_post(Steady* s, PyObject* optimizer) {
  int ok = steady_for(s, optimizer);
  if (ok <= 0) return ok;
  double now = perf_counter();
  PyObject* state = get(s->rec, name.state);
  if (state == nullptr) return -1;
  int plain = plain_end(s, state, now);
  if (plain <= 0) {
    Py_DECREF(state);
    return plain;
  }
  bool done = false;
  PyObject* phases = get(state, name.phases);
  PyObject* now_obj = PyFloat_FromDouble(now);
  PyObject* opened = nullptr;  // (when its step() began, its check): Optimizers.end
  PyObject* fresh = nullptr;   // the next step's StepState
  PyObject* row = nullptr;
  PyObject* step = nullptr;
  if (phases != nullptr && now_obj != nullptr &&
      td::phase_exit(s->timer, td::kPhaseOptimizer, now, phases)) {
    opened = end_update(s, optimizer, now_obj);
    if (opened != nullptr && PyTuple_Check(opened) && PyTuple_GET_SIZE(opened) == 2) {
      double t0 = PyFloat_AsDouble(PyTuple_GET_ITEM(opened, 0));
      PyObject* seconds = PyErr_Occurred() ? nullptr : PyFloat_FromDouble(now - t0);
      PyObject* update = seconds == nullptr ? nullptr : PyTuple_Pack(2, optimizer, seconds);
      Py_XDECREF(seconds);
      done = set_new(state, name.update, update) &&
             td::phase_step_ended(s->timer, now, phases);
    } else if (opened != nullptr) {
      PyErr_SetString(PyExc_TypeError, "Optimizers.open holds no (t0, check)");
    }
  }
  if (done) {
    PyObject* next_start = PyFloat_FromDouble(perf_counter());
    fresh = next_start == nullptr ? nullptr : new_state(s, next_start);
    Py_XDECREF(next_start);
    step = get(s->rec, name.step);
    done = fresh != nullptr && step != nullptr && set(s->rec, name.state, fresh);
  }
  if (done) {
    row = step_row(s, state, optimizer, now, step);
    PyObject* table = row == nullptr ? nullptr : get(s->rows, name.steps);
    PyObject* appended =
        table == nullptr ? nullptr : PyObject_CallMethodOneArg(table, name.append, row);
    done = appended != nullptr && set(s->rows, name.last, row);
    Py_XDECREF(appended);
    Py_XDECREF(table);
  }
  // The next step (_finish): the counts, tracing, the listeners, the probe's evals.
  if (done) {
    PyObject* skip = get(state, name.skip);
    PyObject* skipped = get(s->rec, name.skipped_steps);
    PyObject* steps_done = get(s->rec, name.steps_done);
    PyObject* next = PyNumber_Add(step, one);
    PyObject* more_skipped =
        skip != nullptr && skipped != nullptr ? PyNumber_Add(skipped, skip) : nullptr;
    PyObject* more_done = steps_done != nullptr ? PyNumber_Add(steps_done, one) : nullptr;
    done = next != nullptr && more_skipped != nullptr && more_done != nullptr &&
           set(s->rec, name.skipped_steps, more_skipped) && set(s->rec, name.step, next) &&
           set(s->rec, name.steps_done, more_done);
    Py_XDECREF(skip);
    Py_XDECREF(skipped);
    Py_XDECREF(steps_done);
    Py_XDECREF(more_skipped);
    Py_XDECREF(more_done);
    if (done) {  // TracePlan.next_step's first test (trace_plan.py), then the call with work
      PyObject* host = get(s->rec, name.host);
      PyObject* config = host == nullptr ? nullptr : get(host, name.config);
      PyObject* every = config == nullptr ? nullptr : get(config, name.trace_every);
      long long period = every == nullptr ? -1 : every == Py_None ? 0 : PyLong_AsLongLong(every);
      long long upcoming = PyLong_AsLongLong(next);
      done = every != nullptr && !PyErr_Occurred();
      bool due = period > 0 && (period == 1 || upcoming % period == 1);
      int busy = done ? 0 : -1;
      for (PyObject* flag : {name.requested, name.tracing, name.hooks_on}) {
        if (busy == 0) busy = truth(s->plan, flag);
      }
      done = busy >= 0;
      if (done && (due || busy)) {
        PyObject* compiled = get(s->rec, name.compiled);
        PyObject* result = compiled == nullptr
                               ? nullptr
                               : PyObject_CallMethodObjArgs(s->plan, name.next_step, next,
                                                            every, compiled, nullptr);
        done = result != nullptr;
        Py_XDECREF(result);
        Py_XDECREF(compiled);
      }
      Py_XDECREF(every);
      Py_XDECREF(config);
      Py_XDECREF(host);
    }
    Py_XDECREF(next);
  }
  if (done) {  // rec.silent.on_step_end(state, step), spared while its first test says quiet
    PyObject* quiet = get(s->silent, name.quiet_until);
    int later = quiet == nullptr ? -1 : PyObject_RichCompareBool(step, quiet, Py_LT);
    Py_XDECREF(quiet);
    done = later >= 0;
    if (later == 0) {
      PyObject* result = PyObject_CallMethodObjArgs(s->silent, name.on_step_end, state, step,
                                                    nullptr);
      done = result != nullptr;
      Py_XDECREF(result);
    }
  }
  if (done) {  // for listener in rec.step_listeners: listener(state, step)
    for (Py_ssize_t k = 0; done && k < PyList_GET_SIZE(s->listeners); ++k) {
      PyObject* listener = PyList_GET_ITEM(s->listeners, k);
      Py_INCREF(listener);
      PyObject* result = PyObject_CallFunctionObjArgs(listener, state, step, nullptr);
      Py_DECREF(listener);
      done = result != nullptr;
      Py_XDECREF(result);
    }
  }
  if (done) {  // the probe's evals queued for a step boundary
    PyObject* pending = get(s->safe_point, name.pending);
    int waiting = pending == nullptr ? -1 : PyObject_IsTrue(pending);
    Py_XDECREF(pending);
    done = waiting >= 0;
    if (waiting == 1) {
      PyObject* switch_ = get(s->rec, name.switch_);
      PyObject* result = switch_ == nullptr ? nullptr
                                            : PyObject_CallMethodObjArgs(
                                                  s->safe_point, name.drain, step, switch_, nullptr);
      done = result != nullptr;
      Py_XDECREF(result);
      Py_XDECREF(switch_);
    }
  }
  if (done) {  // asked again where this step's end may have changed it (as _finish does)
    int again = steady_for(s, nullptr);
    again = again < 0 ? -1 : !again;
    if (again == 0) again = truth(s->plan, name.tracing);
    if (again == 0) again = truth(s->silent, name.active);
    if (again == 0) again = truth(s->optimizers, name.several);
    done = again >= 0;
    if (done && again) {
      done = set_new(s->rec, name.steady, PyObject_CallOneArg(s->after, s->rec));
    }
  }
  if (done) s->steps += 1;
  Py_XDECREF(step);
  Py_XDECREF(row);
  Py_XDECREF(fresh);
  Py_XDECREF(opened);
  Py_XDECREF(now_obj);
  Py_XDECREF(phases);
  Py_DECREF(state);
  return done ? 1 : -1;
}

// -- the type ----------------------------------------------------------------------------------

bool arity(Py_ssize_t n, Py_ssize_t want, const char* method) {
  if (n == want) return true;
  PyErr_Format(PyExc_TypeError, "SteadyStep.%s takes %zd arguments (%zd given)", method, want, n);
  return false;
}

Steady* self_of(PyObject* self) { return reinterpret_cast<Steady*>(self); }

PyObject* m_model_call(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!arity(n, 3, "model_call")) return nullptr;
  return answer(model_call(self_of(self), args[0], args[1], args[2]));
}

PyObject* m_model_return(PyObject* self, PyObject*) { return model_return(self_of(self)); }

PyObject* m_backward(PyObject* self, PyObject* tensors) {
  // called from torch_hooks.py's Python wrapper: its caller called torch.autograd.backward
  PyFrameObject* wrapper = PyEval_GetFrame();  // borrowed
  PyFrameObject* caller = wrapper == nullptr ? nullptr : PyFrame_GetBack(wrapper);  // new
  int handled = backward(self_of(self), tensors, caller);
  Py_XDECREF(caller);
  return answer(handled);
}

PyObject* m_backward_done(PyObject* self, PyObject*) { return answer(backward_done(self_of(self))); }

PyObject* m_optimizer_pre(PyObject* self, PyObject* optimizer) {
  return answer(optimizer_pre(self_of(self), optimizer));
}

PyObject* m_optimizer_post(PyObject* self, PyObject* optimizer) {
  return answer(optimizer_post(self_of(self), optimizer));
}

// -- the hooks themselves ------------------------------------------------------------------------
//
// Where no torch.compile is in use, torch calls these directly (a builtin method: no Python
// frame). Each does what its Python twin in torch_hooks.py does, in the same order: nothing
// while torch.export or torch.jit.trace runs the model, while the telemetry is off or (for a
// model's hooks) on another thread than the training one; then the steady way, else the
// general handler; an Exception in either switches the telemetry off (Switch.fail), never the
// training. (Dynamo never sees them: torch_hooks.py swaps the Python twins in at the first
// torch.compile, since Dynamo cannot trace a builtin.)

// 1: record this event, 0: not now, -1: an error is set.
int recording(Steady* s, bool model, bool jit = true) {
  int exporting = truth(s->export_flags, name._is_compiling_flag);
  if (exporting != 0) return exporting < 0 ? -1 : 0;
  if (model && jit && torch::jit::tracer::isTracing()) return 0;  // torch.jit.trace runs it
  int on = truth(s->switch_, name.on);
  if (on != 1 || !model) return on;
  PyObject* train = get(s->rec, name.train_thread);
  if (train == nullptr) return -1;
  unsigned long ident = PyLong_AsUnsignedLong(train);
  Py_DECREF(train);
  if (PyErr_Occurred()) return -1;
  return ident == PyThread_get_thread_ident();
}

// An Exception raised in a handler: the telemetry switched off, the hook returns None. Anything
// else (KeyboardInterrupt, SystemExit) goes on up, as from the Python hooks.
PyObject* settle(Steady* s, bool failed) {
  if (!failed) Py_RETURN_NONE;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  PyObject* result = PyObject_CallMethodOneArg(s->switch_, name.fail, value);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  if (result == nullptr) return nullptr;
  Py_DECREF(result);
  Py_RETURN_NONE;
}

// The general way's handler, called with the event's arguments: false on an error.
bool general(PyObject* owner, PyObject* method, PyObject* a, PyObject* b, PyObject* c) {
  PyObject* result = PyObject_CallMethodObjArgs(owner, method, a, b, c, nullptr);
  Py_XDECREF(result);
  return result != nullptr;
}

// Where the steady handler answered `handled` 0, the general way's owner.method([arg,] now):
// whether either failed.
bool or_general(int handled, PyObject* owner, PyObject* method, PyObject* arg = nullptr) {
  if (handled != 0) return handled < 0;
  PyObject* now = PyFloat_FromDouble(perf_counter());
  bool ok = now != nullptr &&
            (arg != nullptr ? general(owner, method, arg, now, nullptr)
                            : general(owner, method, now, nullptr, nullptr));
  Py_XDECREF(now);
  return !ok;
}

// (module, args, kwargs): a model's forward pre-hook (torch_hooks.model_hooks' model_call).
PyObject* pre_hook(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!arity(n, 3, "pre_hook")) return nullptr;
  Steady* s = self_of(self);
  int now = recording(s, true);
  if (now == 0) Py_RETURN_NONE;
  bool failed = now < 0;
  if (!failed) {
    int handled = model_call(s, args[0], args[1], args[2]);
    failed = handled < 0 ||
             (handled == 0 && !general(s->rec, name.on_model_call, args[0], args[1], args[2]));
  }
  return settle(s, failed);
}

// (module, args, output): a model's forward hook (model_return): the forward phase closes.
PyObject* post_hook(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!arity(n, 3, "post_hook")) return nullptr;
  Steady* s = self_of(self);
  int now = recording(s, true);
  if (now == 1) {
    int nested = truth(s->plan, name.depth);  // a model inside a model, global hooks on
    now = nested < 0 ? -1 : !nested;
  }
  if (now == 0) Py_RETURN_NONE;
  bool failed = now < 0;
  if (!failed) {
    PyObject* result = model_return(s);
    failed = result == nullptr;
    Py_XDECREF(result);
  }
  return settle(s, failed);
}

// (optimizer, args, kwargs): the global optimizer step pre-hook (optimizer_pre).
PyObject* optimizer_pre_hook(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!arity(n, 3, "optimizer_pre_hook")) return nullptr;
  Steady* s = self_of(self);
  int exporting = truth(s->export_flags, name._is_compiling_flag);
  if (exporting > 0) Py_RETURN_NONE;
  if (exporting < 0) return nullptr;  // as from the Python hook: not behind the guard
  // GradScaler.step compares the count to see a skipped step: counted with the switch off too
  s->optimizer_calls += 1;
  int on = truth(s->switch_, name.on);
  if (on == 0) Py_RETURN_NONE;
  bool failed = on < 0 || or_general(optimizer_pre(s, args[0]), s->updates, name.begin, args[0]);
  return settle(s, failed);
}

// (optimizer, args, kwargs): the global optimizer step post-hook (optimizer_post).
PyObject* optimizer_post_hook(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!arity(n, 3, "optimizer_post_hook")) return nullptr;
  Steady* s = self_of(self);
  int now = truth(s->export_flags, name._is_compiling_flag);
  now = now < 0 ? -1 : now ? 0 : truth(s->switch_, name.on);
  if (now == 0) Py_RETURN_NONE;
  bool failed = now < 0 || or_general(optimizer_post(s, args[0]), s->updates, name.end, args[0]);
  return settle(s, failed);
}

// torch.autograd.backward's replacement where no torch.compile is in use (torch_hooks.py's
// `backward` is its Python twin): a Backward object calls its SteadyStep around the original.
// It looks like the function it wraps (__wrapped__, __name__, __doc__ and so inspect.signature
// are the original's), and leaves no frame of ours in a traceback.
struct Backward {
  PyObject_HEAD
  vectorcallfunc call;
  PyObject* steady;    // the SteadyStep
  PyObject* original;  // torch.autograd.backward as it was
};

// What runs around the original: the handler before, the one after (as a `finally`).
PyObject* backward_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Backward* b = reinterpret_cast<Backward*>(self);
  Steady* s = self_of(b->steady);
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  int now = n >= 1 ? recording(s, true, false) : 0;
  if (now == 0) return PyObject_Vectorcall(b->original, args, nargsf, kwnames);
  bool failed = now < 0;
  if (!failed) {
    PyFrameObject* caller = PyEval_GetFrame();  // borrowed: what called torch.autograd.backward
    int handled = backward(s, args[0], caller);
    failed = handled < 0;
    if (handled == 0) {
      PyObject* t = PyFloat_FromDouble(perf_counter());
      PyObject* frame = caller != nullptr ? reinterpret_cast<PyObject*>(caller) : Py_None;
      failed = t == nullptr || !general(s->rec, name.on_backward, args[0], t, frame);
      Py_XDECREF(t);
    }
  }
  PyObject* settled = settle(s, failed);
  if (settled == nullptr) return nullptr;
  Py_DECREF(settled);
  PyObject* result = PyObject_Vectorcall(b->original, args, nargsf, kwnames);
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  if (result == nullptr) PyErr_Fetch(&type, &value, &traceback);
  int on = truth(s->switch_, name.on);
  failed = on < 0 || (on == 1 && or_general(backward_done(s), s->rec, name.on_backward_done));
  settled = settle(s, failed);
  if (settled == nullptr) {  // a KeyboardInterrupt in the handler: it replaces, as in Python
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    Py_XDECREF(result);
    return nullptr;
  }
  Py_DECREF(settled);
  if (result == nullptr) PyErr_Restore(type, value, traceback);
  return result;
}

PyObject* backward_getattr(PyObject* self, PyObject* attr) {
  // what a function has (__name__, __doc__, ...) is the original's
  PyObject* own = PyObject_GenericGetAttr(self, attr);
  if (own != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return own;
  PyErr_Clear();
  return PyObject_GetAttr(reinterpret_cast<Backward*>(self)->original, attr);
}

PyObject* backward_wrapped(PyObject* self, void*) {
  PyObject* original = reinterpret_cast<Backward*>(self)->original;
  Py_INCREF(original);
  return original;
}

PyGetSetDef kBackwardGetSet[] = {
    {"__wrapped__", backward_wrapped, nullptr, "torch.autograd.backward as it was.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

int backward_traverse(PyObject* self, visitproc visit, void* arg) {
  Backward* b = reinterpret_cast<Backward*>(self);
  Py_VISIT(b->steady);
  Py_VISIT(b->original);
  return 0;
}

int backward_clear(PyObject* self) {
  Backward* b = reinterpret_cast<Backward*>(self);
  Py_CLEAR(b->steady);
  Py_CLEAR(b->original);
  return 0;
}

void backward_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  backward_clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject kBackwardType = {
    PyVarObject_HEAD_INIT(nullptr, 0) "torchdoctor.native._kernels.Backward",
    sizeof(Backward),
};

// SteadyStep.wrap_backward(original): the Backward that stands for torch.autograd.backward.
PyObject* wrap_backward(PyObject* self, PyObject* original) {
  if (!PyCallable_Check(original)) {
    PyErr_SetString(PyExc_TypeError, "wrap_backward needs torch.autograd.backward");
    return nullptr;
  }
  Backward* b = PyObject_GC_New(Backward, &kBackwardType);
  if (b == nullptr) return nullptr;
  b->call = backward_call;
  Py_INCREF(self);
  b->steady = self;
  Py_INCREF(original);
  b->original = original;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(b));
  return reinterpret_cast<PyObject*>(b);
}

#define TD_FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f))

PyMethodDef kMethods[] = {
    {"model_call", TD_FAST(m_model_call), METH_FASTCALL,
     "model_call($self, module, args, kwargs, /)\n--\n\n"
     "A model's forward pre-hook on a steady step; False: the general way (nothing done)."},
    {"model_return", m_model_return, METH_NOARGS,
     "model_return($self, /)\n--\n\nA model's forward hook: the forward phase closes (any step)."},
    {"backward", m_backward, METH_O,
     "backward($self, tensors, /)\n--\n\n"
     "backward() begins, called from its wrapper (the frame above is the loss's line); False:\n"
     "the general way."},
    {"backward_done", m_backward_done, METH_NOARGS,
     "backward_done($self, /)\n--\n\nbackward() returned; False: the general way."},
    {"optimizer_pre", m_optimizer_pre, METH_O,
     "optimizer_pre($self, optimizer, /)\n--\n\n"
     "The primary's optimizer.step() begins; False: the general way."},
    {"optimizer_post", m_optimizer_post, METH_O,
     "optimizer_post($self, optimizer, /)\n--\n\n"
     "The primary's optimizer.step() returned: the step's row and the next step; False: the\n"
     "general way."},
    {"wrap_backward", wrap_backward, METH_O,
     "wrap_backward($self, original, /)\n--\n\n"
     "What stands for torch.autograd.backward (`original`) while no torch.compile is in use."},
    {"pre_hook", TD_FAST(pre_hook), METH_FASTCALL,
     "pre_hook($self, module, args, kwargs, /)\n--\n\nA model's forward pre-hook (torch calls it)."},
    {"post_hook", TD_FAST(post_hook), METH_FASTCALL,
     "post_hook($self, module, args, output, /)\n--\n\nA model's forward hook (torch calls it)."},
    {"optimizer_pre_hook", TD_FAST(optimizer_pre_hook), METH_FASTCALL,
     "optimizer_pre_hook($self, optimizer, args, kwargs, /)\n--\n\n"
     "The global optimizer step pre-hook (torch calls it)."},
    {"optimizer_post_hook", TD_FAST(optimizer_post_hook), METH_FASTCALL,
     "optimizer_post_hook($self, optimizer, args, kwargs, /)\n--\n\n"
     "The global optimizer step post-hook (torch calls it)."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* get_steps(PyObject* self, void*) { return PyLong_FromLongLong(self_of(self)->steps); }

PyObject* get_optimizer_calls(PyObject* self, void*) {
  return PyLong_FromLongLong(self_of(self)->optimizer_calls);
}

// (object, attribute) for every attribute the handlers use of the Recorder's parts, beyond
// the StepState's and torch's: a test checks each against a real Recorder.
const char* const kUses[][2] = {
    {"rec", "steady"},          {"rec", "state"},           {"rec", "memory_at_setup"},
    {"rec", "next_rank_poll"},  {"rec", "step"},            {"rec", "steps_done"},
    {"rec", "skipped_steps"},   {"rec", "rank"},            {"rec", "compiled"},
    {"rec", "switch"},          {"rec", "timer"},           {"rec", "step_listeners"},
    {"rec.silent", "active"},   {"rec.plan", "tracing"},    {"rec.plan", "shaping"},
    {"rec.plan", "discovering"}, {"rec.plan", "hooks_on"},  {"rec.plan", "requested"},
    {"rec.plan", "next_step"},  {"rec.roots", "generator"}, {"rec.roots", "last_walk"},
    {"rec.roots", "call_site"}, {"rec.roots", "loss_site"}, {"rec.roots", "pending"},
    {"rec.optimizers", "several"}, {"rec.optimizers", "closure_checked"},
    {"rec.optimizers", "open"}, {"rec.rows", "cuda"},
    {"rec.rows", "steps"},      {"rec.rows", "last"},       {"rec.memory", "latest"},
    {"rec.memory", "read"},     {"rec.safe_point", "pending"},
    {"rec.safe_point", "drain"}, {"rec.host.config", "trace_every"},
    {"rec.silent", "quiet_until"}, {"rec.silent", "on_step_end"},
};

PyObject* get_names(PyObject*, void*) {
  constexpr Py_ssize_t n = sizeof(kUses) / sizeof(kUses[0]);
  PyObject* out = PyTuple_New(n);
  for (Py_ssize_t k = 0; out != nullptr && k < n; ++k) {
    PyObject* pair = Py_BuildValue("(ss)", kUses[k][0], kUses[k][1]);
    if (pair == nullptr) {
      Py_CLEAR(out);
      break;
    }
    PyTuple_SET_ITEM(out, k, pair);
  }
  return out;
}

PyGetSetDef kGetSet[] = {
    {"steps", get_steps, nullptr, "Steps ended by optimizer_post.", nullptr},
    {"optimizer_calls", get_optimizer_calls, nullptr,
     "optimizer.step() calls seen by optimizer_pre_hook (the switch off too).", nullptr},
    {"names", get_names, nullptr, "(object, attribute) pairs the handlers use.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// Every reference a SteadyStep holds, for the garbage collector (it holds its Recorder, whose
// hooks hold it).
template <typename F>
void each_ref(Steady* s, F f) {
  PyObject** refs[] = {&s->rec,        &s->timer,         &s->silent,        &s->plan,
                       &s->roots,      &s->optimizers,    &s->rows,          &s->memory,
                       &s->safe_point, &s->listeners,     &s->row_type,
                       &s->state_type, &s->after,         &s->learning_rate, &s->autocast_now,
                       &s->any_autocast, &s->torch,       &s->export_flags,
                       &s->switch_,    &s->updates,       &s->sum,           &s->zero_phases};
  for (PyObject** ref : refs) f(ref);
}

int traverse(PyObject* self, visitproc visit, void* arg) {
  int out = 0;
  each_ref(self_of(self), [&](PyObject** ref) {
    if (out == 0 && *ref != nullptr) out = visit(*ref, arg);
  });
  return out;
}

int clear(PyObject* self) {
  each_ref(self_of(self), [](PyObject** ref) { Py_CLEAR(*ref); });
  return 0;
}

void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  clear(self);
  Py_TYPE(self)->tp_free(self);
}

// SteadyStep(recorder, parts): `parts` is telemetry/steady.py's Parts.
PyObject* make(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *rec, *parts;
  static const char* keywords[] = {"recorder", "parts", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:SteadyStep", const_cast<char**>(keywords),
                                   &rec, &parts)) {
    return nullptr;
  }
  Steady* s = reinterpret_cast<Steady*>(type->tp_alloc(type, 0));
  if (s == nullptr) return nullptr;
  Py_INCREF(rec);
  s->rec = rec;
  struct Part {
    PyObject** slot;
    PyObject* from;
    const char* attr;
  };
  const Part found[] = {
      {&s->timer, rec, "timer"},          {&s->silent, rec, "silent"},
      {&s->plan, rec, "plan"},            {&s->roots, rec, "roots"},
      {&s->optimizers, rec, "optimizers"}, {&s->rows, rec, "rows"},
      {&s->memory, rec, "memory"},        {&s->safe_point, rec, "safe_point"},
      {&s->listeners, rec, "step_listeners"},
      {&s->row_type, parts, "row_type"},  {&s->state_type, parts, "state_type"},
      {&s->after, parts, "after"},        {&s->learning_rate, parts, "learning_rate"},
      {&s->autocast_now, parts, "autocast_now"}, {&s->any_autocast, parts, "any_autocast"},
      {&s->torch, parts, "torch"},        {&s->export_flags, parts, "export_flags"},
      {&s->switch_, rec, "switch"},
      {&s->updates, rec, "updates"},
  };
  for (const Part& part : found) {
    *part.slot = PyObject_GetAttrString(part.from, part.attr);
    if (*part.slot == nullptr) {
      Py_DECREF(s);
      return nullptr;
    }
  }
  s->sum = PyDict_GetItemString(PyEval_GetBuiltins(), "sum");
  Py_XINCREF(s->sum);
  PyObject* limit = PyObject_GetAttrString(parts, "limit");
  PyObject* tape = PyObject_GetAttrString(parts, "tape_limit");
  s->limit = limit == nullptr ? -1 : PyLong_AsLongLong(limit);
  s->tape_limit = tape == nullptr ? -1 : PyLong_AsSsize_t(tape);
  Py_XDECREF(limit);
  Py_XDECREF(tape);
  s->steps = 0;
  s->optimizer_calls = 0;
  PyObject* zero = PyObject_GetAttrString(parts, "zero_phases");  // phases.zero
  s->zero_phases = zero == nullptr ? nullptr : PyObject_CallNoArgs(zero);
  Py_XDECREF(zero);
  if (PyErr_Occurred() || s->sum == nullptr || s->zero_phases == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "builtins.sum is missing");
    Py_DECREF(s);
    return nullptr;
  }
  // what the handlers rely on: the compiled timer, a list of listeners, python.steps' row
  PyObject* columns = PyObject_GetAttrString(s->row_type, "_fields");
  bool same = columns != nullptr && PyTuple_Check(columns) && PyTuple_GET_SIZE(columns) == kRowSize;
  Py_XDECREF(columns);
  PyErr_Clear();
  const char* wrong = !td::is_phase_timer(s->timer)   ? "the Recorder's timer is not a PhaseTimer"
                      : !PyList_Check(s->listeners)     ? "step_listeners is not a list"
                      : !PyType_Check(s->row_type) ||
                              !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(s->row_type),
                                                &PyTuple_Type)
                          ? "row_type is not a tuple type"
                      : !same ? "row_type is not python.steps' row (steps_layout.h)"
                      : !PyDict_Check(s->zero_phases) ||
                              PyDict_GET_SIZE(s->zero_phases) != td::kPhaseOptimizer + 1
                          ? "Parts.zero_phases did not make the five phases"
                              : nullptr;
  if (wrong != nullptr) {
    PyErr_SetString(PyExc_TypeError, wrong);
    Py_DECREF(s);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(s);
}

PyTypeObject kSteadyType = {
    PyVarObject_HEAD_INIT(nullptr, 0) "torchdoctor.native._kernels.SteadyStep",
    sizeof(Steady),
};

}  // namespace

namespace td {

bool add_steady_step(PyObject* module) {
#define TD_INTERN(n) name.n = PyUnicode_InternFromString(python_name(#n));
  TD_STEADY_NAMES(TD_INTERN)
#undef TD_INTERN
  one = PyLong_FromLong(1);
  empty = PyTuple_New(0);
  if (one == nullptr || empty == nullptr) return false;
  kSteadyType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  kSteadyType.tp_doc =
      "SteadyStep(recorder, parts)\n--\n\n"
      "The steady step's handlers, called by the hooks (telemetry/steady.py).";
  kSteadyType.tp_new = make;
  kSteadyType.tp_dealloc = dealloc;
  kSteadyType.tp_traverse = traverse;
  kSteadyType.tp_clear = clear;
  kSteadyType.tp_methods = kMethods;
  kSteadyType.tp_getset = kGetSet;
  kBackwardType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  kBackwardType.tp_doc = "torch.autograd.backward, recorded (SteadyStep.wrap_backward).";
  kBackwardType.tp_vectorcall_offset = offsetof(Backward, call);
  kBackwardType.tp_call = PyVectorcall_Call;
  kBackwardType.tp_getattro = backward_getattr;
  kBackwardType.tp_getset = kBackwardGetSet;
  kBackwardType.tp_traverse = backward_traverse;
  kBackwardType.tp_clear = backward_clear;
  kBackwardType.tp_dealloc = backward_dealloc;
  return PyType_Ready(&kBackwardType) == 0 && add_type(module, &kSteadyType, "SteadyStep");
}

}  // namespace td
