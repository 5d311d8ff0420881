// The Python module `lightning_zerocopy._C`. It carries build facts and, in CUDA builds, the host-memory
// registration calls (host_register / host_unregister) that need no tensors; the ops are registered with the
// torch dispatcher by the static initializers of the other translation units when this library loads.
#include <Python.h>

#ifndef ZEROCOPY_TORCH_VERSION
#error "ZEROCOPY_TORCH_VERSION must be defined by setup.py"
#endif

#ifdef ZEROCOPY_WITH_CUDA
#include "ops/cuda/host_memory.h"
#include "ops/cuda/sample_neighbors/sample_neighbors_glue.h"

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

// set_lean_sampler(enabled) -> the previous setting (see sample_neighbors_glue.h).
static PyObject* set_lean_sampler(PyObject*, PyObject* args) {
  int enabled = 1;
  if (!PyArg_ParseTuple(args, "p:set_lean_sampler", &enabled)) return nullptr;
  return PyBool_FromLong(zerocopy::set_lean_sampler_enabled(enabled != 0) ? 1 : 0);
}

// set_sampler_graphs(enabled) -> the previous setting (see sample_neighbors_glue.h).
static PyObject* set_sampler_graphs(PyObject*, PyObject* args) {
  int enabled = 1;
  if (!PyArg_ParseTuple(args, "p:set_sampler_graphs", &enabled)) return nullptr;
  return PyBool_FromLong(zerocopy::set_sampler_graphs_enabled(enabled != 0) ? 1 : 0);
}

// sampler_graph_stats() -> dict of the CUDA-graph path's counters.
static PyObject* sampler_graph_stats(PyObject*, PyObject*) {
  const zerocopy::SamplerGraphStats s = zerocopy::sampler_graph_stats();
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L}", "captures", static_cast<long long>(s.captures), "replays",
                       static_cast<long long>(s.replays), "failures", static_cast<long long>(s.failures),
                       "evictions", static_cast<long long>(s.evictions), "cached", static_cast<long long>(s.cached));
}

static PyMethodDef zerocopy_methods[] = {
    {"host_register", host_register, METH_VARARGS,
     "cudaHostRegister(address, nbytes, flags); returns the cudaError code and clears it from the thread."},
    {"host_unregister", host_unregister, METH_VARARGS,
     "cudaHostUnregister(address); returns the cudaError code and clears it from the thread."},
    {"set_lean_sampler", set_lean_sampler, METH_VARARGS,
     "Whether bounded CUDA sampler batches take the lean path (benchmarks, tests); returns the old setting."},
    {"set_sampler_graphs", set_sampler_graphs, METH_VARARGS,
     "Whether lean CUDA sampler batches replay a CUDA graph captured per batch shape; returns the old setting."},
    {"sampler_graph_stats", sampler_graph_stats, METH_NOARGS,
     "Counters of the CUDA sampler's graph path: captures, replays, failures, evictions, cached."},
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
