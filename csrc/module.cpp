// The Python module `lightning_zerocopy._C`. It only carries build facts; the ops are registered with the
// torch dispatcher by the static initializers of the other translation units when this library loads.
#include <Python.h>

#ifndef ZEROCOPY_TORCH_VERSION
#error "ZEROCOPY_TORCH_VERSION must be defined by setup.py"
#endif

#ifdef ZEROCOPY_WITH_CUDA
static constexpr int kWithCuda = 1;
#else
static constexpr int kWithCuda = 0;
#endif

static struct PyModuleDef zerocopy_module = {
    PyModuleDef_HEAD_INIT, "_C", "Compiled ops of lightning_zerocopy (registered under torch.ops.zerocopy).",
    -1, nullptr,
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
