// The Python module `lightning_zerocopy._C`. It carries build facts and, in CUDA builds, the host-memory
// registration calls (host_register / host_unregister: raw addresses, not tensors, pinned with the GIL released) and
// how this process's host threads wait for the GPU (set_wait_schedule / wait_schedule: cudaSetDeviceFlags' bits).
// Every op, the sampler's switches included, binds through the torch dispatcher instead (schemas in library.cpp,
// kernels registered by the static initializers of the other translation units when this library loads).
#include <Python.h>

#ifndef ZEROCOPY_TORCH_VERSION
#error "ZEROCOPY_TORCH_VERSION must be defined by setup.py"
#endif

#ifdef ZEROCOPY_WITH_CUDA
#include "ops/cuda/host_memory.h"
#include "ops/cuda/wait_schedule.h"

static constexpr int kWithCuda = 1;

// host_register(address, nbytes, flags) -> cudaError as int; the GIL is released while the driver pins.
static PyObject* host_register(PyObject*, PyObject* args) {
  unsigned long long address = 0, nbytes = 0;
  unsigned int flags = 0;
  if (!PyArg_ParseTuple(args, "KKI:host_register", &address, &nbytes, &flags)) return nullptr;
  int code = 0;
  Py_BEGIN_ALLOW_THREADS
  code = zerocopy::cuda::host_register(address, nbytes, flags);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(code);
}

// host_unregister(address) -> cudaError as int.
static PyObject* host_unregister(PyObject*, PyObject* args) {
  unsigned long long address = 0;
  if (!PyArg_ParseTuple(args, "K:host_unregister", &address)) return nullptr;
  int code = 0;
  Py_BEGIN_ALLOW_THREADS
  code = zerocopy::cuda::host_unregister(address);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(code);
}

// set_wait_schedule(device, schedule) -> cudaError as int.
static PyObject* set_wait_schedule(PyObject*, PyObject* args) {
  int device = 0;
  unsigned int schedule = 0;
  if (!PyArg_ParseTuple(args, "iI:set_wait_schedule", &device, &schedule)) return nullptr;
  return PyLong_FromLong(zerocopy::cuda::set_wait_schedule(device, schedule));
}

// wait_schedule(device) -> (cudaError as int, schedule bits).
static PyObject* wait_schedule(PyObject*, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i:wait_schedule", &device)) return nullptr;
  unsigned int schedule = 0;
  int code = zerocopy::cuda::wait_schedule(device, &schedule);
  return Py_BuildValue("(iI)", code, schedule);
}

static PyMethodDef zerocopy_methods[] = {
    {"host_register", host_register, METH_VARARGS,
     "cudaHostRegister(address, nbytes, flags); returns the cudaError code and clears it from the thread."},
    {"host_unregister", host_unregister, METH_VARARGS,
     "cudaHostUnregister(address); returns the cudaError code and clears it from the thread."},
    {"set_wait_schedule", set_wait_schedule, METH_VARARGS,
     "cudaSetDeviceFlags' schedule bits of a device for this process (other flags kept); returns the cudaError code."},
    {"wait_schedule", wait_schedule, METH_VARARGS,
     "(cudaError code, the schedule bits of a device's flags) for this process."},
    {nullptr, nullptr, 0, nullptr},
};
#else
static constexpr int kWithCuda = 0;
static PyMethodDef* const zerocopy_methods = nullptr;
#endif

static struct PyModuleDef zerocopy_module = {
    PyModuleDef_HEAD_INIT, "_C", "Compiled ops of lightning_zerocopy (registered under torch.ops.zerocopy).",
    -1, zerocopy_methods,
};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* module = PyModule_Create(&zerocopy_module);
  if (module == nullptr) return nullptr;
  if (PyModule_AddStringConstant(module, "torch_version", ZEROCOPY_TORCH_VERSION) < 0 ||
      PyModule_AddIntConstant(module, "with_cuda", kWithCuda) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
