// PhaseTimer: telemetry/phases.py's PhaseTimer, compiled. Same methods, same results (the
// unit tests run both), for the few calls a step makes into it from the hooks: in Python each
// call ran 50 to 90 opcodes (docs/benchmarks.md), here it is a handful of dict operations.
//
// What a phase is, and why phases nest, is said in phases.py; this file only keeps the stack
// of open phases in C++ instead of a list of lists. The totals stay a Python dict (the step's
// StepState.phases) so that everything else reads them as before.

#include "native.h"

#include <structmember.h>

#include <vector>

namespace {

// The phases, in phases.py's COLUMN order: the name a hook passes, the column its time goes to.
enum Phase { kData, kForward, kEvaluation, kBackward, kOptimizer, kPhases };
const char* const kNames[kPhases] = {"data", "forward", "evaluation", "backward", "optimizer"};
const char* const kColumns[kPhases] = {"data_wait", "forward", "evaluation", "backward",
                                       "optimizer"};
static_assert(kData == td::kPhaseData && kForward == td::kPhaseForward &&
                  kEvaluation == td::kPhaseEvaluation && kBackward == td::kPhaseBackward &&
                  kOptimizer == td::kPhaseOptimizer,
              "native.h's PhaseId is this order");
constexpr int kStart = kPhases;  // the gap that opens a step ("start")

PyObject* name_of[kPhases + 1];  // interned: "data" ... "optimizer", "start"
PyObject* column_of[kPhases];
PyObject* other;                 // "other": the phase while none is open

struct Open {
  int phase;
  double since;  // running since; < 0 while paused by a phase opened inside it
  long calls;    // model calls open (forward and evaluation only)
};

struct Timer {
  PyObject_HEAD
  std::vector<Open>* open;
  int after;     // the phase that closed last (the gap running now follows it)
  double since;  // ... since then
  PyObject* input_shares;  // dict: gap name -> the share of it booked as data_wait
};

bool segment(int phase) { return phase == kForward || phase == kEvaluation; }

// The phase a name stands for, or -1 with KeyError set. Hooks pass literals, interned as these
// are: the pointer comparison almost always decides.
int phase_of(PyObject* name) {
  for (int k = 0; k < kPhases; ++k) {
    if (name == name_of[k]) return k;
  }
  if (PyUnicode_Check(name)) {
    for (int k = 0; k < kPhases; ++k) {
      if (PyUnicode_Compare(name, name_of[k]) == 0) return k;
    }
  }
  PyErr_SetObject(PyExc_KeyError, name);
  return -1;
}

// totals[column of phase] += seconds
bool add(PyObject* totals, int phase, double seconds) {
  PyObject* key = column_of[phase];
  if (!PyDict_Check(totals)) {
    PyErr_SetString(PyExc_TypeError, "totals must be a dict");
    return false;
  }
  PyObject* now = PyDict_GetItemWithError(totals, key);  // borrowed
  if (now == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
    return false;
  }
  double value = PyFloat_AsDouble(now);
  if (value == -1.0 && PyErr_Occurred()) return false;
  PyObject* sum = PyFloat_FromDouble(value + seconds);
  if (sum == nullptr) return false;
  int failed = PyDict_SetItem(totals, key, sum);
  Py_DECREF(sum);
  return failed == 0;
}

// An input function's share of the gap that ends now is data (phases.py: input_shares).
bool book_gap(Timer* t, double now, PyObject* totals) {
  if (t->input_shares == nullptr || !PyDict_Check(t->input_shares) ||
      PyDict_GET_SIZE(t->input_shares) == 0) {
    return true;
  }
  PyObject* share = PyDict_GetItemWithError(t->input_shares, name_of[t->after]);
  if (share == nullptr) return !PyErr_Occurred();
  double fraction = PyFloat_AsDouble(share);
  if (fraction == -1.0 && PyErr_Occurred()) return false;
  return fraction == 0.0 || add(totals, kData, (now - t->since) * fraction);
}

// The phase below the one just closed runs again; with none, a gap after `closed` begins.
void resume(Timer* t, int closed, double now) {
  if (!t->open->empty()) {
    t->open->back().since = now;
  } else {
    t->after = closed;
    t->since = now;
  }
}

// The innermost open model call closes: its time is booked, what it paused runs again.
bool close_segment(Timer* t, double now, PyObject* totals) {
  Open closed = t->open->back();
  t->open->pop_back();
  if (closed.since >= 0 && !add(totals, closed.phase, now - closed.since)) return false;
  resume(t, closed.phase, now);
  return true;
}

bool enter(Timer* t, int phase, double now, PyObject* totals) {
  auto& open = *t->open;
  if (!open.empty()) {
    Open& top = open.back();
    if (top.since >= 0 && !add(totals, top.phase, now - top.since)) return false;
    top.since = -1;
  } else if (!book_gap(t, now, totals)) {
    return false;
  }
  open.push_back({phase, now, 1});
  return true;
}

bool inside(Timer* t, int phase) {
  for (const Open& o : *t->open) {
    if (o.phase == phase) return true;
  }
  return false;
}

bool exit(Timer* t, int phase, double now, PyObject* totals) {
  auto& open = *t->open;
  if (!open.empty() && open.back().phase == phase) {  // the usual case: the innermost
    double since = open.back().since;
    open.pop_back();
    if (since >= 0 && !add(totals, phase, now - since)) return false;
    resume(t, phase, now);
    return true;
  }
  if (!inside(t, phase)) return true;  // opened before a reset (switched on mid-call)
  while (!open.empty()) {
    Open o = open.back();
    open.pop_back();
    if (o.since >= 0 && !add(totals, o.phase, now - o.since)) return false;
    if (o.phase == phase) break;
  }
  resume(t, phase, now);
  return true;
}

// -- arguments ---------------------------------------------------------------------------------

bool number(PyObject* arg, double* out) {
  *out = PyFloat_AsDouble(arg);
  return !(*out == -1.0 && PyErr_Occurred());
}

bool arity(Py_ssize_t n, Py_ssize_t low, Py_ssize_t high, const char* name) {
  if (n >= low && n <= high) return true;
  PyErr_Format(PyExc_TypeError, "PhaseTimer.%s takes %zd to %zd arguments (%zd given)", name, low,
               high, n);
  return false;
}

// -- methods -----------------------------------------------------------------------------------

PyObject* timer_enter(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  double now;
  if (!arity(n, 3, 3, "enter") || !number(args[1], &now)) return nullptr;
  int phase = phase_of(args[0]);
  if (phase < 0 || !enter(reinterpret_cast<Timer*>(self), phase, now, args[2])) return nullptr;
  Py_RETURN_NONE;
}

PyObject* timer_exit(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  double now;
  if (!arity(n, 3, 3, "exit") || !number(args[1], &now)) return nullptr;
  int phase = phase_of(args[0]);
  if (phase < 0) {  // never opened: nothing to close
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  if (!exit(reinterpret_cast<Timer*>(self), phase, now, args[2])) return nullptr;
  Py_RETURN_NONE;
}

PyObject* timer_inside(PyObject* self, PyObject* name) {
  int phase = phase_of(name);
  if (phase < 0) {  // never opened, so not inside it
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  return PyBool_FromLong(inside(reinterpret_cast<Timer*>(self), phase));
}

PyObject* timer_begin_forward(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  double now;
  if (!arity(n, 2, 3, "begin_forward") || !number(args[0], &now)) return nullptr;
  int phase = kForward;
  if (n == 3 && (phase = phase_of(args[2])) < 0) return nullptr;
  int opened = td::phase_begin_forward(self, now, args[1], phase);
  if (opened < 0) return nullptr;
  return PyBool_FromLong(opened);
}

PyObject* timer_end_forward(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  double now;
  if (!arity(n, 2, 2, "end_forward") || !number(args[0], &now)) return nullptr;
  if (!td::phase_end_forward(self, now, args[1])) return nullptr;
  Py_RETURN_NONE;
}

PyObject* timer_step_ended(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  double now;
  if (!arity(n, 2, 2, "step_ended") || !number(args[0], &now)) return nullptr;
  if (!td::phase_step_ended(self, now, args[1])) return nullptr;
  Py_RETURN_NONE;
}

PyObject* timer_reset(PyObject* self, PyObject*) {
  Timer* t = reinterpret_cast<Timer*>(self);
  t->open->clear();
  t->after = kStart;
  Py_RETURN_NONE;
}

PyMethodDef kTimerMethods[] = {
    {"enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(timer_enter)),
     METH_FASTCALL, "enter($self, phase, now, totals, /)\n--\n\nA phase opens, pausing the one around it."},
    {"exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(timer_exit)),
     METH_FASTCALL, "exit($self, phase, now, totals, /)\n--\n\nA phase closes (and any opened inside it)."},
    {"inside", timer_inside, METH_O, "inside($self, phase, /)\n--\n\nWhether that phase is open."},
    {"begin_forward",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(timer_begin_forward)),
     METH_FASTCALL,
     "begin_forward($self, now, totals, segment='forward', /)\n--\n\n"
     "A model's top-level call begins; True when its segment opened now."},
    {"end_forward",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(timer_end_forward)),
     METH_FASTCALL, "end_forward($self, now, totals, /)\n--\n\nA model's top-level call returned."},
    {"step_ended", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(timer_step_ended)),
     METH_FASTCALL, "step_ended($self, now, totals, /)\n--\n\nThe step's end; the next opens with its gap."},
    {"reset", timer_reset, METH_NOARGS, "reset($self, /)\n--\n\nNothing open."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* get_phase(PyObject* self, void*) {
  Timer* t = reinterpret_cast<Timer*>(self);
  PyObject* name = t->open->empty() ? other : name_of[t->open->back().phase];
  Py_INCREF(name);
  return name;
}

PyObject* get_gap(PyObject* self, void*) {
  Timer* t = reinterpret_cast<Timer*>(self);
  if (!t->open->empty()) Py_RETURN_NONE;
  Py_INCREF(name_of[t->after]);
  return name_of[t->after];
}

PyObject* get_after(PyObject* self, void*) {
  Timer* t = reinterpret_cast<Timer*>(self);
  Py_INCREF(name_of[t->after]);
  return name_of[t->after];
}

PyObject* get_since(PyObject* self, void*) {
  return PyFloat_FromDouble(reinterpret_cast<Timer*>(self)->since);
}

PyObject* get_shares(PyObject* self, void*) {
  PyObject* shares = reinterpret_cast<Timer*>(self)->input_shares;
  Py_INCREF(shares);
  return shares;
}

int set_shares(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !PyDict_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "input_shares must be a dict");
    return -1;
  }
  Timer* t = reinterpret_cast<Timer*>(self);
  Py_INCREF(value);
  Py_SETREF(t->input_shares, value);
  return 0;
}

PyGetSetDef kTimerGetSet[] = {
    {"phase", get_phase, nullptr, "What runs now: data, forward, ... or other.", nullptr},
    {"gap", get_gap, nullptr, "The gap running now, or None while a phase is open.", nullptr},
    {"after", get_after, nullptr, "The phase the running (or last) gap follows.", nullptr},
    {"since", get_since, nullptr, "When that gap began.", nullptr},
    {"input_shares", get_shares, set_shares, "gap -> share of it booked as data_wait", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyObject* timer_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0)) {
    PyErr_SetString(PyExc_TypeError, "PhaseTimer() takes no arguments");
    return nullptr;
  }
  PyObject* shares = PyDict_New();
  if (shares == nullptr) return nullptr;
  Timer* t = reinterpret_cast<Timer*>(type->tp_alloc(type, 0));
  if (t == nullptr) {
    Py_DECREF(shares);
    return nullptr;
  }
  t->open = new std::vector<Open>();
  t->open->reserve(8);
  t->after = kStart;
  t->since = 0.0;
  t->input_shares = shares;
  return reinterpret_cast<PyObject*>(t);
}

void timer_dealloc(PyObject* self) {
  Timer* t = reinterpret_cast<Timer*>(self);
  delete t->open;
  Py_XDECREF(t->input_shares);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject kTimerType = {
    PyVarObject_HEAD_INIT(nullptr, 0) "torchdoctor.native._kernels.PhaseTimer",
    sizeof(Timer),
};

Timer* as_timer(PyObject* timer) { return reinterpret_cast<Timer*>(timer); }

}  // namespace

namespace td {

// The timer's operations for the steady step (steady.cpp), on a PhaseTimer it has checked with
// is_phase_timer; false: a Python error is set.
bool is_phase_timer(PyObject* obj) { return Py_TYPE(obj) == &kTimerType; }
bool phase_enter(PyObject* timer, int phase, double now, PyObject* totals) {
  return enter(as_timer(timer), phase, now, totals);
}
bool phase_exit(PyObject* timer, int phase, double now, PyObject* totals) {
  return exit(as_timer(timer), phase, now, totals);
}
bool phase_inside(PyObject* timer, int phase) { return inside(as_timer(timer), phase); }
int phase_begin_forward(PyObject* timer, double now, PyObject* totals, int segment_phase) {
  Timer* t = as_timer(timer);
  if (!t->open->empty() && segment(t->open->back().phase)) {  // a model called inside a model
    t->open->back().calls += 1;
    return 0;
  }
  return enter(t, segment_phase, now, totals) ? 1 : -1;
}
bool phase_end_forward(PyObject* timer, double now, PyObject* totals) {
  Timer* t = as_timer(timer);
  auto& open = *t->open;
  if (!open.empty() && segment(open.back().phase)) {
    Open& top = open.back();
    if (top.calls > 1) {
      top.calls -= 1;
      return true;
    }
    return close_segment(t, now, totals);
  }
  return exit(t, kForward, now, totals);
}
bool phase_step_ended(PyObject* timer, double now, PyObject* totals) {
  Timer* t = as_timer(timer);
  auto& open = *t->open;
  if (!open.empty() && segment(open.back().phase) && !close_segment(t, now, totals)) {
    return false;
  }
  if (open.empty()) {
    if (!book_gap(t, now, totals)) return false;
    t->after = kStart;
    t->since = now;
  }
  return true;
}

bool add_phase_timer(PyObject* module) {
  for (int k = 0; k < kPhases; ++k) {
    name_of[k] = PyUnicode_InternFromString(kNames[k]);
    column_of[k] = PyUnicode_InternFromString(kColumns[k]);
    if (name_of[k] == nullptr || column_of[k] == nullptr) return false;
  }
  name_of[kStart] = PyUnicode_InternFromString("start");
  other = PyUnicode_InternFromString("other");
  if (name_of[kStart] == nullptr || other == nullptr) return false;
  kTimerType.tp_flags = Py_TPFLAGS_DEFAULT;
  kTimerType.tp_doc =
      "PhaseTimer()\n--\n\n"
      "Exclusive time per phase of the step in progress, and the gaps between phases\n"
      "(telemetry/phases.py's PhaseTimer, compiled).";
  kTimerType.tp_new = timer_new;
  kTimerType.tp_dealloc = timer_dealloc;
  kTimerType.tp_methods = kTimerMethods;
  kTimerType.tp_getset = kTimerGetSet;
  return add_type(module, &kTimerType, "PhaseTimer");
}

}  // namespace td
