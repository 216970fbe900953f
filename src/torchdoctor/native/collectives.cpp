// python.collectives, recorded in C++: the same rows as the Python kernel of
// telemetry/collectives.py, for a fraction of its cost per call (docs/benchmarks.md).
//
// A kernel per c10d op at the BackendSelect key: it reads the call (group, tensors, peer) in
// C++, takes the GIL only for what lives in Python (the step, the issuing line; see Host),
// writes the journal's `I` line with one write() before the call goes on, and ends the call:
// through its future's callback where the backend completes that future when the work is
// done (CPU tensors: gloo), by polling the work otherwise (NCCL completes its future at
// launch). The line's layout is store/journal.py's and the schema's, through the header
// generated from them (journal_layout.h, see native/layout.py); Python reads it back for live
// queries.
//
// Python drives it through the functions of native.h (module.cpp makes them Python's);
// telemetry/collectives_native.py is the other half. Nothing here raises into the training: a
// failure turns recording off and is kept for Python to report.

#include <Python.h>
#include <frameobject.h>

#include "journal_layout.h"
#include "native.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <algorithm>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// A JSON value's text, ready for the journal line.
struct Json {
  std::string text;
};

struct Spec {
  std::string c10d;  // the op's name in the c10d namespace
  std::string name;  // as the table names it
  Json quoted;       // the same, as JSON
  int inputs;        // argument holding this rank's tensors, -1: none
  int group;         // argument holding the process group
  int peer;          // argument holding the peer or root (a group rank), -1: none
  bool p2p;          // numbered per peer instead of per group
  bool gathers;      // its output is the group's size times its input
};

struct Group {
  c10::weak_intrusive_ptr<c10d::ProcessGroup> alive;  // keeps the address from being reused
  Json label;
  std::vector<long> ranks;                            // global rank of each group rank
  std::atomic<long> seq{0};
  std::map<std::pair<std::string, long>, long> p2p;  // (op, peer) -> next number
  // The id of its latest call seen completed (not point-to-point): every call of the group
  // issued before it is over too (a group's calls end in order), seen or not.
  std::atomic<long> completed_upto{-1};
  explicit Group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) : alive(pg) {}
  long global(long group_rank) const {
    return group_rank >= 0 && group_rank < (long)ranks.size() ? ranks[group_rank] : group_rank;
  }
};

struct Pending {
  long id;
  c10::intrusive_ptr<c10d::Work> work;
  long bytes;
  Group* group;  // nullptr for a point-to-point call (numbered per peer, not in order)
};

void completed(Group* group, long id) {
  if (group == nullptr) return;
  long seen = group->completed_upto.load();
  while (id > seen && !group->completed_upto.compare_exchange_weak(seen, id)) {
  }
}

// Bounds of the works held for polling, set by Python (set_bounds: telemetry/collectives.py's
// POLL_AT, HELD_BYTES): past them the calling thread polls.
std::atomic<size_t> g_poll_at{64};
std::atomic<long> g_held_bytes{256L << 20};

std::vector<Spec> g_specs;
torch::Library* g_library = nullptr;
std::atomic<bool> g_enabled{false};
std::atomic<long> g_ids{0};
// Held works and described groups live on the heap and are never freed: at the process's exit,
// destroying a work after its backend is gone (NCCL after CUDA) could crash the exit.
using Groups = std::unordered_map<c10d::ProcessGroup*, std::unique_ptr<Group>>;
std::mutex g_groups_lock;  // *g_groups and each group's p2p counters
Groups* g_groups = new Groups();
std::mutex g_fd_lock;  // the journal's file descriptor: open, write, close
int g_fd = -1;
std::mutex g_pending_lock;
std::vector<Pending>* g_pending = new std::vector<Pending>();
long g_held = 0;
std::mutex g_poll_lock;  // one poll at a time
std::mutex g_endings_lock;
std::vector<std::shared_ptr<struct Ending>>* g_endings = nullptr;  // see Ending
std::mutex g_failure_lock;
std::string g_failure;
// What the kernel asks Python: the facts that live only there, each a callable given once per
// run (configure: the public methods of telemetry/collectives_native.py's KernelHost), called
// with the GIL held. Why each crossing remains:
struct Host {
  // Every call: the step in progress, or None while recording is off. The step and the
  // switches that turn recording off (the Recorder's, collective tracing's) are Python's.
  PyObject* step = nullptr;
  // The run's first call: the journal's path, or None (record nothing). The run directory is
  // known once the rank is (process_group.py), and the table reads the file back from then on.
  PyObject* journal = nullptr;
  // A group's first call: (label, the global rank of each group rank, its first number), or
  // None. Global ranks and which group is the default live in torch.distributed's Python
  // bookkeeping, and c10d_ops.group_facts says them for both kernels.
  PyObject* group = nullptr;
  // A code object's first issuing frame: 2 the user's file, 1 another library's, 0 torch's or
  // torchdoctor's: frames.py's rule, the one for every "your line" torchdoctor shows.
  PyObject* file_kind = nullptr;
  // A call on a thread with no Python frames (a CUDA backward): the training thread's
  // backward() line, which only the Recorder saw, as "file:line", or None.
  PyObject* backward_site = nullptr;
};
Host g_host;
std::unordered_map<PyObject*, int> g_kinds;  // code object (a reference held) -> kind; GIL
// The journal: asked for at the run's first call, open until the run's end (close).
enum JournalState { kAsk, kOpen, kDone };
std::atomic<int> g_journal{kAsk};

c10::DispatchKeySet after_backend_select() {
  return c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
}

long wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

long mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

void fail(const std::string& why) {
  g_enabled.store(false);
  std::lock_guard<std::mutex> hold(g_failure_lock);
  if (g_failure.empty()) g_failure = why;
}

void json_string(std::string& out, const char* text) {
  out += '"';
  for (const char* c = text; *c; ++c) {
    unsigned char ch = static_cast<unsigned char>(*c);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += *c;
    } else if (ch < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += *c;
    }
  }
  out += '"';
}

Json quoted(const char* text) {
  Json out;
  json_string(out.text, text);
  return out;
}

const Json kNull{"null"};
const Json kIssuedState = quoted(journal::kIssuedState);

// A row's values as JSON, set by column (journal_layout.h's constants: a value of another type
// than the column's, or a null where it may not be, does not compile); written as one line.
class Row {
 public:
  template <bool N>
  void set(journal::Int<N> c, long value) {
    text_[c.index] = std::to_string(value);
  }
  template <bool N>
  void set(journal::Str<N> c, const Json& value) {
    text_[c.index] = value.text;
  }
  template <bool N>
  void set_ns(journal::Float<N> c, long ns) {  // nanoseconds, as seconds ("<ns>e-9")
    text_[c.index] = std::to_string(ns) + "e-9";
  }
  void null(journal::Int<true> c) { text_[c.index] = kNull.text; }
  void null(journal::Float<true> c) { text_[c.index] = kNull.text; }
  void null(journal::Str<true> c) { text_[c.index] = kNull.text; }

  // The issued line, or "" where a column was left without a value (a column the schema has
  // and this kernel does not fill: recording stops, and says which).
  std::string issued_line(long id) const {
    std::string line = journal::kIssued;
    line += '[';
    line += std::to_string(id);
    for (int i = 0; i < journal::kColumns; ++i) {
      if (text_[i].empty()) {
        fail(std::string("the schema's column ") + journal::kNames[i] +
             " has no value in the C++ kernel (native/collectives.cpp fills none)");
        return std::string();
      }
      line += ',';
      line += text_[i];
    }
    line += "]\n";
    return line;
  }

 private:
  std::array<std::string, journal::kColumns> text_;
};

void write_line(const std::string& line) {
  std::lock_guard<std::mutex> hold(g_fd_lock);
  if (g_fd < 0) return;
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = write(g_fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // a full disk costs the record, never the training
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
}

// E [id, duration, state]; `started` < 0: the duration is not known (null).
void write_end(long id, long started, const char* state) {
  char buf[128];
  if (started < 0) {
    snprintf(buf, sizeof buf, "%s[%ld,null,\"%s\"]\n", journal::kEnded, id, state);
  } else {
    snprintf(buf, sizeof buf, "%s[%ld,%.9f,\"%s\"]\n", journal::kEnded, id,
             (mono_ns() - started) / 1e9, state);
  }
  write_line(buf);
}

// torch's own names (str(torch.float32)[6:]) of the usual dtypes
const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return nullptr;
  }
}

void collect(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList().vec()) out.push_back(t);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) collect(item, out);
  }
}

struct Facts {
  bool any = false;  // tensors at all (else shapes and dtype are null)
  Json shapes;       // a string holding the JSON list of shapes
  Json dtype;
  long bytes = 0;
  bool cpu = true;
};

Facts facts_of(const c10::IValue& value) {
  std::vector<at::Tensor> tensors;
  collect(value, tensors);
  Facts f;
  if (tensors.empty()) return f;
  std::string shapes = "[";
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (i) shapes += ',';
    shapes += '[';
    auto sizes = t.sizes();
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (d) shapes += ',';
      shapes += std::to_string(sizes[d]);
    }
    shapes += ']';
    f.bytes += static_cast<long>(t.numel() * t.element_size());
    if (!t.device().is_cpu()) f.cpu = false;
  }
  shapes += ']';
  f.any = true;
  f.shapes.text = '"' + shapes + '"';  // digits, brackets and commas: nothing to escape
  const char* name = dtype_name(tensors[0].scalar_type());
  std::string lower;
  if (name == nullptr) {  // a rarer dtype: torch's C++ name, lower case
    for (const char* c = c10::toString(tensors[0].scalar_type()); *c; ++c) lower += (char)tolower(*c);
    name = lower.c_str();
  }
  f.dtype = quoted(name);
  return f;
}

// -- what lives in Python (the GIL held) --------------------------------------------------------

int kind_of(PyCodeObject* code) {
  auto it = g_kinds.find(reinterpret_cast<PyObject*>(code));
  if (it != g_kinds.end()) return it->second;
  int kind = 0;
  PyObject* r = PyObject_CallOneArg(g_host.file_kind, code->co_filename);
  if (r != nullptr) {
    kind = static_cast<int>(PyLong_AsLong(r));
    Py_DECREF(r);
  }
  PyErr_Clear();
  if (g_kinds.size() < 100000) {
    Py_INCREF(code);  // held: its address stays its own
    g_kinds.emplace(reinterpret_cast<PyObject*>(code), kind);
  }
  return kind;
}

// The user's line that issued the call (frames.user_frame's rule), as JSON.
Json site_json() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::string out;
  std::string fallback;
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    int kind = kind_of(code);
    if (kind == 2 || (kind == 1 && fallback.empty())) {
      const char* path = PyUnicode_AsUTF8(code->co_filename);
      std::string where = std::string(path ? path : "?") + ":" +
                          std::to_string(PyFrame_GetLineNumber(frame));
      (kind == 2 ? out : fallback) = quoted(where.c_str()).text;
    }
    Py_DECREF(code);
    if (!out.empty()) {
      Py_DECREF(frame);
      return Json{out};
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  if (!fallback.empty()) return Json{fallback};
  PyObject* r = PyObject_CallNoArgs(g_host.backward_site);  // a backward on another thread
  if (r != nullptr && PyUnicode_Check(r)) {
    const char* text = PyUnicode_AsUTF8(r);
    if (text != nullptr) json_string(out, text);
  }
  Py_XDECREF(r);
  PyErr_Clear();
  return out.empty() ? kNull : Json{out};
}

// Host.step: the step in progress; false while recording is off (or Python could not say).
bool step_now(long* step) {
  PyObject* r = PyObject_CallNoArgs(g_host.step);
  bool on = r != nullptr && r != Py_None;
  if (on) {
    *step = PyLong_AsLong(r);
    on = !PyErr_Occurred();
  }
  Py_XDECREF(r);
  PyErr_Clear();
  return on;
}

// Host.journal, at the run's first call: open it; whether the run's journal is open.
bool journal_open() {
  int state = g_journal.load();
  if (state != kAsk) return state == kOpen;
  PyObject* r = PyObject_CallNoArgs(g_host.journal);
  const char* path = r != nullptr && PyUnicode_Check(r) ? PyUnicode_AsUTF8(r) : nullptr;
  int fd = path != nullptr ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
  if (path != nullptr && fd < 0) {
    fail(std::string("cannot write the collectives journal ") + path + ": " + strerror(errno));
  }
  Py_XDECREF(r);
  PyErr_Clear();
  {
    std::lock_guard<std::mutex> hold(g_fd_lock);
    if (g_fd >= 0) close(g_fd);
    g_fd = fd;
  }
  g_journal.store(fd >= 0 ? kOpen : kDone);  // None or no file: nothing recorded this run
  return fd >= 0;
}

// A group seen for the first time: Host.group describes it.
Group* describe(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  std::unique_ptr<Group> group(new Group(pg));
  std::string name = pg->getGroupName();
  PyObject* r = PyObject_CallFunction(g_host.group, "si", name.c_str(), pg->getSize());
  bool ok = false;
  if (r != nullptr && PyTuple_Check(r) && PyTuple_Size(r) == 3) {
    const char* label = PyUnicode_AsUTF8(PyTuple_GetItem(r, 0));
    PyObject* ranks = PyTuple_GetItem(r, 1);
    long start = PyLong_AsLong(PyTuple_GetItem(r, 2));
    if (label != nullptr && PyList_Check(ranks) && !PyErr_Occurred()) {
      group->label = quoted(label);
      for (Py_ssize_t i = 0; i < PyList_Size(ranks); ++i) {
        group->ranks.push_back(PyLong_AsLong(PyList_GetItem(ranks, i)));
      }
      group->seq.store(start);
      ok = !PyErr_Occurred();
    }
  }
  Py_XDECREF(r);
  PyErr_Clear();
  if (!ok) return nullptr;  // Python could not describe it (and said why)
  std::lock_guard<std::mutex> hold(g_groups_lock);
  auto& slot = (*g_groups)[pg.get()];
  if (!slot || slot->alive.expired()) slot = std::move(group);
  return slot.get();
}

Group* lookup(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  std::lock_guard<std::mutex> hold(g_groups_lock);
  auto it = g_groups->find(pg.get());
  return it == g_groups->end() || it->second->alive.expired() ? nullptr : it->second.get();
}

// -- ending calls ------------------------------------------------------------------------------

bool raised(const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    return work->exception() != nullptr;
  } catch (...) {
    return true;
  }
}

void poll_works(bool errors) {
  std::unique_lock<std::mutex> one(g_poll_lock, std::try_to_lock);
  if (!one.owns_lock()) return;  // another thread polls now
  std::vector<Pending> works;
  {
    std::lock_guard<std::mutex> hold(g_pending_lock);
    works.swap(*g_pending);
    g_held = 0;
  }
  std::vector<Pending> still;
  for (Pending& p : works) {
    bool done;
    try {
      done = p.work->isCompleted();
    } catch (...) {
      done = true;
    }
    if (done) {
      bool failed = errors && raised(p.work);
      write_end(p.id, -1, failed ? journal::kFailed : journal::kCompleted);
      if (!failed) completed(p.group, p.id);
    } else {
      still.push_back(std::move(p));
    }
  }
  // A work a backend never marks completed (gloo's reduce-scatter under FSDP2) would be held,
  // its tensors with it, for ever: it is over once a later call of its group completed (the
  // journal's reader ends its row by the same rule).
  still.erase(std::remove_if(still.begin(), still.end(),
                             [](const Pending& p) {
                               return p.group != nullptr && p.id < p.group->completed_upto.load();
                             }),
              still.end());
  if (!still.empty()) {
    std::lock_guard<std::mutex> hold(g_pending_lock);
    long held = 0;
    for (const Pending& p : still) held += p.bytes;
    still.insert(still.end(), std::make_move_iterator(g_pending->begin()),
                 std::make_move_iterator(g_pending->end()));
    g_pending->swap(still);
    g_held += held;
  }
}

// A call whose end its future's callback writes. c10's Future wakes its waiters before it runs
// the callbacks, so the thread that waited (DDP's Reducer) can go on, and the process can end
// (gloo aborting the next call) before the end is written: the next call's issue writes the
// end of every such call already completed first. Whichever comes first writes it, once.
struct Ending {
  long id;
  long started;
  Group* group;  // nullptr for a point-to-point call
  c10::weak_intrusive_ptr<c10::ivalue::Future> future;  // not kept alive (its tensors) by us
  std::atomic<bool> written{false};
  Ending(long i, long s, Group* g, const c10::intrusive_ptr<c10::ivalue::Future>& f)
      : id(i), started(s), group(g), future(f) {}
};

void end_once(Ending& e, const c10::ivalue::Future& f) {
  if (e.written.exchange(true)) return;
  bool failed = f.hasError();
  write_end(e.id, e.started, failed ? journal::kFailed : journal::kCompleted);
  if (!failed) completed(e.group, e.id);
}

void write_completed_ends() {
  std::lock_guard<std::mutex> hold(g_endings_lock);
  if (g_endings == nullptr || g_endings->empty()) return;
  std::vector<std::shared_ptr<Ending>> still;
  for (auto& e : *g_endings) {
    if (e->written.load()) continue;
    auto f = e->future.lock();
    if (!f) continue;  // gone, its callbacks run
    if (f->completed()) {
      end_once(*e, *f);
    } else {
      still.push_back(e);
    }
  }
  g_endings->swap(still);
}

void follow(long id, long started, long bytes, bool cpu, Group* group,
            torch::jit::Stack& stack) {
  if (stack.empty() || !stack.back().isCustomClass()) {  // synchronous: over already
    write_end(id, started, journal::kCompleted);
    return;
  }
  auto work = stack.back().toCustomClass<c10d::Work>();
  if (cpu) {
    // CPU backends complete the future when the work is done: the exact end, no work held.
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (...) {  // gloo's send and recv have none
    }
    if (future) {
      auto ending = std::make_shared<Ending>(id, started, group, future);
      {
        std::lock_guard<std::mutex> hold(g_endings_lock);
        if (g_endings == nullptr) g_endings = new std::vector<std::shared_ptr<Ending>>();
        g_endings->push_back(ending);
      }
      future->addCallback([ending](c10::ivalue::Future& f) { end_once(*ending, f); });
      return;
    }
  }
  bool crowded;
  {
    std::lock_guard<std::mutex> hold(g_pending_lock);
    g_pending->push_back(Pending{id, work, bytes, group});
    g_held += bytes;
    crowded = g_pending->size() >= g_poll_at.load() || g_held >= g_held_bytes.load();
  }
  if (crowded) poll_works(false);  // a work keeps its tensors alive: few and small
}

// -- the kernel ----------------------------------------------------------------------------------

struct Issued {
  long id = -1;
  long started = 0;
  long bytes = 0;
  bool cpu = true;
  Group* group = nullptr;  // nullptr for a point-to-point call
};

Issued issue(const Spec& spec, const torch::jit::Stack& stack, size_t nargs) {
  Issued out;
  const c10::IValue* args = stack.data() + (stack.size() - nargs);
  auto pg = args[spec.group].toCustomClass<c10d::ProcessGroup>();
  Facts facts = spec.inputs >= 0 ? facts_of(args[spec.inputs]) : Facts();
  long group_rank_peer = spec.peer >= 0 ? args[spec.peer].toInt() : -1;

  Group* group = lookup(pg);
  Json site;
  long step = 0;
  {
    PyGILState_STATE gil = PyGILState_Ensure();
    if (!step_now(&step) || !journal_open()) {
      PyGILState_Release(gil);
      return out;
    }
    if (group == nullptr && (group = describe(pg)) == nullptr) {
      g_enabled.store(false);  // stop asking
      PyGILState_Release(gil);
      return out;
    }
    site = site_json();
    PyGILState_Release(gil);
  }
  long peer = spec.peer >= 0 ? group->global(group_rank_peer) : -1;
  long seq;
  if (spec.p2p) {
    std::lock_guard<std::mutex> hold(g_groups_lock);
    seq = group->p2p[{spec.name, peer}]++;
  } else {
    seq = group->seq++;
  }
  namespace column = journal::column;
  Row row;
  row.set(column::step, step);
  row.set(column::group, group->label);
  row.set(column::seq, seq);
  row.set(column::op, spec.quoted);
  if (facts.any) {
    row.set(column::shapes, facts.shapes);
    row.set(column::dtype, facts.dtype);
  } else {
    row.null(column::shapes);
    row.null(column::dtype);
  }
  row.set(column::bytes, facts.bytes);
  if (peer >= 0) {
    row.set(column::peer, peer);
  } else {
    row.null(column::peer);
  }
  row.set_ns(column::time, wall_ns());
  row.null(column::duration);
  row.set(column::state, kIssuedState);
  row.set(column::site, site);
  row.set(column::rank, group->global(pg->getRank()));
  long id = g_ids++;
  std::string line = row.issued_line(id);
  if (line.empty()) return out;  // a column without a value: off (fail said which)
  out.id = id;
  out.bytes = spec.gathers ? facts.bytes * static_cast<long>(group->ranks.size()) : facts.bytes;
  out.cpu = facts.cpu;
  out.group = spec.p2p ? nullptr : group;
  write_completed_ends();  // the ends of the calls before, ahead of this call's line
  out.started = mono_ns();
  write_line(line);  // on disk before the call that may end the process
  return out;
}

struct Kernel final : public c10::OperatorKernel {
  explicit Kernel(const Spec& s) : spec(s) {}
  Spec spec;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    keys = keys & after_backend_select();
    if (!g_enabled.load(std::memory_order_relaxed) || !Py_IsInitialized() || finalizing()) {
      op.redispatchBoxed(keys, stack);
      return;
    }
    Issued call;
    try {
      call = issue(spec, *stack, op.schema().arguments().size());
    } catch (const std::exception& e) {
      fail(std::string("recording ") + spec.name + ": " + e.what());
    }
    if (call.id < 0) {
      op.redispatchBoxed(keys, stack);
      return;
    }
    try {
      op.redispatchBoxed(keys, stack);
    } catch (...) {
      write_end(call.id, call.started, journal::kFailed);
      throw;
    }
    try {
      follow(call.id, call.started, call.bytes, call.cpu, call.group, *stack);
    } catch (const std::exception& e) {
      fail(std::string("following ") + spec.name + ": " + e.what());
    }
  }
};

void forget_after_fork() {
  // The child of a fork: the parent's journal, works and locks are not its own. Recording
  // stays off until a probe of the child's configures it again.
  g_enabled.store(false);
  new (&g_fd_lock) std::mutex();
  new (&g_pending_lock) std::mutex();
  new (&g_poll_lock) std::mutex();
  new (&g_endings_lock) std::mutex();
  g_endings = nullptr;  // the parent's: left, never touched
  new (&g_groups_lock) std::mutex();
  new (&g_failure_lock) std::mutex();
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  g_journal.store(kDone);
  g_pending = new std::vector<Pending>();  // the parent's works: left, never touched
  g_held = 0;
  g_groups = new Groups();
}

}  // namespace

// -- what Python calls (native.h; module.cpp makes them Python functions), the GIL held ----------

namespace td {

void at_load() { pthread_atfork(nullptr, nullptr, forget_after_fork); }

// Register the kernels for the ops this torch has among `ops` (the first call's list is kept:
// the table of ops is telemetry/c10d_ops.py's, the same every time); False on failure (the
// Python kernel is used then).
PyObject* register_ops(PyObject*, PyObject* ops) {
  if (g_library != nullptr) Py_RETURN_TRUE;
  if (g_specs.empty()) {
    PyObject* items = PySequence_Fast(ops, "register: a list of op tuples");
    if (items == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
      const char *c10d, *name;
      int inputs, group, peer, p2p, gathers;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "ssiiipp", &c10d, &name,
                            &inputs, &group, &peer, &p2p, &gathers)) {
        Py_DECREF(items);
        g_specs.clear();
        return nullptr;
      }
      g_specs.push_back(
          Spec{c10d, name, quoted(name), inputs, group, peer, p2p != 0, gathers != 0});
    }
    Py_DECREF(items);
  }
  try {
    auto library = std::make_unique<torch::Library>(
        torch::Library::IMPL, "c10d", c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
    for (const Spec& spec : g_specs) {
      if (!c10::Dispatcher::singleton().findOp(c10::OperatorName("c10d::" + spec.c10d, ""))) {
        continue;  // an op this torch does not have
      }
      library->impl(spec.c10d.c_str(),
                    torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(spec)));
    }
    g_library = library.release();
  } catch (const std::exception&) {
    Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyObject* unregister(PyObject*, PyObject*) {
  g_enabled.store(false);
  delete g_library;  // the dispatcher forgets the kernels
  g_library = nullptr;
  Py_RETURN_NONE;
}

// A new run: Host's callables (keyword arguments, each required), the journal asked for again
// at the run's first call, the groups described again.
PyObject* configure(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"step", "journal", "group", "file_kind", "backward_site",
                                nullptr};
  Host host;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOO", const_cast<char**>(names),
                                   &host.step, &host.journal, &host.group, &host.file_kind,
                                   &host.backward_site)) {
    return nullptr;
  }
  PyObject* given[] = {host.step, host.journal, host.group, host.file_kind, host.backward_site};
  for (int i = 0; i < 5; ++i) {
    if (given[i] == nullptr || !PyCallable_Check(given[i])) {
      PyErr_Format(PyExc_TypeError, "configure: %s must be given, a callable", names[i]);
      return nullptr;
    }
  }
  g_enabled.store(false);
  PyObject* old[] = {g_host.step, g_host.journal, g_host.group, g_host.file_kind,
                     g_host.backward_site};
  for (PyObject* o : given) Py_INCREF(o);
  g_host = host;
  for (PyObject* o : old) Py_XDECREF(o);
  g_journal.store(kAsk);
  // The old descriptions are kept (a call on another thread may hold one this moment); a few
  // per run.
  static auto* retired = new std::vector<std::unique_ptr<Group>>();  // never freed, as above
  std::lock_guard<std::mutex> hold(g_groups_lock);
  for (auto& entry : *g_groups) retired->push_back(std::move(entry.second));
  g_groups->clear();
  Py_RETURN_NONE;
}

PyObject* enable(PyObject*, PyObject* on) {
  int yes = PyObject_IsTrue(on);
  if (yes < 0) return nullptr;
  g_enabled.store(yes == 1 && g_host.step != nullptr);
  Py_RETURN_NONE;
}

PyObject* set_bounds(PyObject*, PyObject* args) {
  long works, bytes;
  if (!PyArg_ParseTuple(args, "ll", &works, &bytes)) return nullptr;
  g_poll_at.store(static_cast<size_t>(works));
  g_held_bytes.store(bytes);
  Py_RETURN_NONE;
}

// Any thread; the GIL let go while it polls (a work may take a while to answer).
PyObject* poll(PyObject*, PyObject* errors) {
  int check = PyObject_IsTrue(errors);
  if (check < 0) return nullptr;
  size_t pending = 0;
  Py_BEGIN_ALLOW_THREADS
  poll_works(check == 1);
  {
    std::lock_guard<std::mutex> hold(g_pending_lock);  // let go before the GIL is taken back
    pending = g_pending->size();
  }
  Py_END_ALLOW_THREADS
  return PyLong_FromSize_t(pending);
}

PyObject* close_journal(PyObject*, PyObject*) {
  g_journal.store(kDone);
  std::lock_guard<std::mutex> hold(g_fd_lock);
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  Py_RETURN_NONE;
}

PyObject* take_failure(PyObject*, PyObject*) {
  std::string said;
  {
    std::lock_guard<std::mutex> hold(g_failure_lock);
    said.swap(g_failure);
  }
  return PyUnicode_DecodeUTF8(said.data(), static_cast<Py_ssize_t>(said.size()), "replace");
}

}  // namespace td
