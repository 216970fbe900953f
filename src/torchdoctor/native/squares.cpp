// sum_of_squares: the step's gradient norm squared, for a few small CPU tensors, read in place.
//
// torch's way (one flatten, one norm, one .item()) goes through the dispatcher three times and
// allocates the flat copy: about 20 us for four small tensors where the arithmetic is under 1
// (docs/benchmarks.md). Here: one call, the tensors unpacked from their Python objects, each
// element squared and summed in double; no dispatch, no allocation, the GIL held throughout (the
// tensors stay as they are meanwhile). Anything this does not read directly (a tensor on
// another device, sparse, strided, a subclass, an integer dtype) answers None: the caller asks
// torch instead. grad_squares does the same for the gradients of the optimizer's parameters,
// read from each parameter in C++: no Python list of gradients built every step;
// squares_of_groups reads them from an optimizer's param_groups (the steady step, steady.cpp).

#include "native.h"

#include <torch/csrc/autograd/python_variable.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace {

// Eight sums side by side, so that the additions do not wait on each other and the compiler
// (-O3 for this file) may keep them in vector registers: ~0.3-0.5 ns an element here, against
// 1-1.5 ns for one sum. Each element becomes a float (bfloat16 and float16 exactly), then a
// double.
constexpr int kLanes = 8;

template <typename T>
__attribute__((always_inline)) inline double squares(const T* data, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      double x = static_cast<double>(static_cast<float>(data[i + k]));
      lane[k] += x * x;
    }
  }
  for (; i < n; ++i) {
    double x = static_cast<double>(static_cast<float>(data[i]));
    lane[0] += x * x;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <>
double squares<double>(const double* data, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) lane[k] += data[i + k] * data[i + k];
  }
  for (; i < n; ++i) lane[0] += data[i] * data[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// float32, the common case, once more for CPUs with AVX2 (chosen when the library loads: four
// floats become four doubles in one instruction, about 3x fewer instructions per element than
// the baseline x86-64 build; docs/benchmarks.md).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
double squares_f32(const float* data, int64_t n) {
  return squares(data, n);
}

// The tensor's own memory, when it is a plain CPU tensor held whole in it.
bool readable(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return impl->device_type() == c10::DeviceType::CPU && impl->layout() == c10::kStrided &&
         !impl->is_python_dispatch() && impl->has_storage() && impl->is_contiguous() &&
         !impl->is_neg() && !impl->is_conj();
}

// The squares of one readable tensor added to `total`; false for one this cannot read.
bool add_squares(const at::Tensor& t, double* total) {
  if (!readable(t)) return false;
  int64_t n = t.numel();
  if (n == 0) return true;
  const void* data = t.unsafeGetTensorImpl()->data();
  if (data == nullptr) return false;
  switch (t.scalar_type()) {
    case c10::ScalarType::Float:
      *total += squares_f32(static_cast<const float*>(data), n);
      return true;
    case c10::ScalarType::Double:
      *total += squares(static_cast<const double*>(data), n);
      return true;
    case c10::ScalarType::BFloat16:
      *total += squares(static_cast<const c10::BFloat16*>(data), n);
      return true;
    case c10::ScalarType::Half:
      *total += squares(static_cast<const c10::Half*>(data), n);
      return true;
    default:
      return false;
  }
}

}  // namespace

namespace td {

PyObject* sum_of_squares(PyObject*, PyObject* tensors) {
  if (!PyList_Check(tensors) && !PyTuple_Check(tensors)) Py_RETURN_NONE;
  PyObject** items = PySequence_Fast_ITEMS(tensors);
  Py_ssize_t count = PySequence_Fast_GET_SIZE(tensors);
  double total = 0;
  try {
    for (Py_ssize_t k = 0; k < count; ++k) {
      // a Tensor or a Parameter: no subclass (a DTensor's local part is not the whole)
      if (!THPVariable_CheckExact(items[k])) Py_RETURN_NONE;
      const at::Tensor& t = THPVariable_Unpack(items[k]);
      if (!t.defined() || !add_squares(t, &total)) Py_RETURN_NONE;
    }
  } catch (const std::exception&) {  // a tensor torch would not let us read: ask torch
    Py_RETURN_NONE;
  }
  return PyFloat_FromDouble(total);
}

namespace {

// The gradients of one list of parameters added to the running sums; false where one cannot be
// read here (the caller answers None).
bool add_grads(PyObject* params, long long limit, double* total, long long* elements,
               Py_ssize_t* with_grad) {
  if (!PyList_Check(params)) return false;
  PyObject** items = PySequence_Fast_ITEMS(params);
  Py_ssize_t count = PySequence_Fast_GET_SIZE(params);
  for (Py_ssize_t k = 0; k < count; ++k) {
    if (!THPVariable_CheckExact(items[k])) return false;  // a DTensor: its shard, in Python
    const at::Tensor& grad = THPVariable_Unpack(items[k]).grad();
    if (!grad.defined()) continue;
    *elements += grad.numel();
    if (*elements > limit || !add_squares(grad, total)) return false;
    ++*with_grad;
  }
  return true;
}

}  // namespace

PyObject* grad_squares(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (n != 2 || !PyList_Check(args[0])) Py_RETURN_NONE;
  long long limit = PyLong_AsLongLong(args[1]);
  if (limit == -1 && PyErr_Occurred()) return nullptr;
  double total = 0;
  long long elements = 0;
  Py_ssize_t with_grad = 0;
  try {
    if (!add_grads(args[0], limit, &total, &elements, &with_grad)) Py_RETURN_NONE;
  } catch (const std::exception&) {
    Py_RETURN_NONE;
  }
  return Py_BuildValue("(dn)", total, with_grad);
}

bool squares_of_groups(PyObject* groups, long long limit, double* total, Py_ssize_t* with_grad) {
  static PyObject* kParams = PyUnicode_InternFromString("params");
  if (!PyList_Check(groups) || kParams == nullptr) return false;
  PyObject** items = PySequence_Fast_ITEMS(groups);
  Py_ssize_t count = PySequence_Fast_GET_SIZE(groups);
  long long elements = 0;
  *total = 0;
  *with_grad = 0;
  try {
    for (Py_ssize_t g = 0; g < count; ++g) {
      if (!PyDict_CheckExact(items[g])) return false;
      PyObject* params = PyDict_GetItemWithError(items[g], kParams);  // borrowed
      if (params == nullptr) PyErr_Clear();
      if (params == nullptr || !add_grads(params, limit, total, &elements, with_grad)) {
        return false;
      }
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

bool read_scalar(PyObject* tensor, double* out) {
  // A one-element tensor's value as .item() gives it, read in place (the loss, every step):
  // no dispatch. False for anything add_squares could not read (the caller asks .item()).
  if (!THPVariable_CheckExact(tensor)) return false;
  try {
    const at::Tensor& t = THPVariable_Unpack(tensor);
    if (!t.defined() || t.numel() != 1 || !readable(t)) return false;
    const void* data = t.unsafeGetTensorImpl()->data();
    if (data == nullptr) return false;
    switch (t.scalar_type()) {
      case c10::ScalarType::Float:
        *out = *static_cast<const float*>(data);
        return true;
      case c10::ScalarType::Double:
        *out = *static_cast<const double*>(data);
        return true;
      case c10::ScalarType::BFloat16:
        *out = static_cast<float>(*static_cast<const c10::BFloat16*>(data));
        return true;
      case c10::ScalarType::Half:
        *out = static_cast<float>(*static_cast<const c10::Half*>(data));
        return true;
      default:
        return false;
    }
  } catch (const std::exception&) {
    return false;
  }
}

PyObject* scalar_value(PyObject*, PyObject* tensor) {
  double value;
  if (!read_scalar(tensor, &value)) Py_RETURN_NONE;
  return PyFloat_FromDouble(value);
}

}  // namespace td
