// convoy.distribute._sparse_rows: a parameter server's row reads and row updates, compiled.
//
// scatter_add(target, rows, values, scale) does target[rows[i]] += scale * values[i] for each
// i in turn (a repeated row gets each of its values), in one pass with the GIL released. numpy
// needs a sort to find repeated rows first, or ufunc.at, which goes an element at a time.
// gather(source, rows, out) copies rows as np.take does. Both fetch the rows ahead of use:
// a training step's rows are scattered over a table larger than the caches. The caller
// guarantees that nobody else changes these arrays meanwhile (the store runs one operation at
// a time).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstdint>
#include <cstring>

namespace {

// `object` as a C-contiguous, aligned array (writable if asked), else nullptr with a
// TypeError naming `what`.
PyArrayObject* Contiguous(PyObject* object, bool writable, const char* what) {
  if (!PyArray_Check(object)) {
    PyErr_Format(PyExc_TypeError, "%s must be a numpy array", what);
    return nullptr;
  }
  auto* array = reinterpret_cast<PyArrayObject*>(object);
  int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
  if (!PyArray_CHKFLAGS(array, flags)) {
    PyErr_Format(PyExc_TypeError, "%s must be a contiguous%s array", what,
                 writable ? " writable" : "");
    return nullptr;
  }
  return array;
}

// Rows ahead whose cache lines are fetched while one is used: each would otherwise wait for
// memory in turn.
constexpr npy_intp kAhead = 8;
constexpr npy_intp kLine = 64;

void Prefetch(const char* row, npy_intp bytes) {
  for (npy_intp byte = 0; byte < bytes; byte += kLine) __builtin_prefetch(row + byte, 1);
}

template <typename T>
void AddRows(T* target, const int64_t* rows, const T* values, npy_intp n, npy_intp width,
             T scale) {
  const npy_intp bytes = width * static_cast<npy_intp>(sizeof(T));
  for (npy_intp i = 0; i < n && i < kAhead; ++i) {
    Prefetch(reinterpret_cast<const char*>(target + rows[i] * width), bytes);
  }
  for (npy_intp i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      Prefetch(reinterpret_cast<const char*>(target + rows[i + kAhead] * width), bytes);
    }
    T* row = target + rows[i] * width;
    const T* value = values + i * width;
    for (npy_intp j = 0; j < width; ++j) row[j] += scale * value[j];
  }
}

// The rows' number and width (items) of `array`; false, with a ValueError, if it has none.
bool Shape(PyArrayObject* array, const char* what, npy_intp* height, npy_intp* width) {
  if (PyArray_NDIM(array) < 1) {
    PyErr_Format(PyExc_ValueError, "%s must have rows (at least one dimension)", what);
    return false;
  }
  *height = PyArray_DIM(array, 0);
  *width = *height ? PyArray_SIZE(array) / *height : 0;
  return true;
}

// Whether every row is in [0, height), else false with an IndexError naming the first not.
bool InRange(const int64_t* row, npy_intp n, npy_intp height) {
  for (npy_intp i = 0; i < n; ++i) {
    if (row[i] < 0 || row[i] >= height) {
      PyErr_Format(PyExc_IndexError, "row %lld is out of range [0, %zd)",
                   static_cast<long long>(row[i]), height);
      return false;
    }
  }
  return true;
}

// scatter_add(target, rows, values, scale) -> None
PyObject* ScatterAdd(PyObject*, PyObject* args) {
  PyObject *target_object, *rows_object, *values_object;
  double scale;
  if (!PyArg_ParseTuple(args, "OOOd", &target_object, &rows_object, &values_object, &scale)) {
    return nullptr;
  }
  PyArrayObject* target = Contiguous(target_object, true, "target");
  PyArrayObject* rows = target ? Contiguous(rows_object, false, "rows") : nullptr;
  PyArrayObject* values = rows ? Contiguous(values_object, false, "values") : nullptr;
  if (!values) return nullptr;
  int type = PyArray_TYPE(target);
  if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) || PyArray_TYPE(values) != type) {
    PyErr_SetString(PyExc_TypeError,
                    "target must be float32 or float64, and values of the same dtype");
    return nullptr;
  }
  if (PyArray_TYPE(rows) != NPY_INT64) {
    PyErr_SetString(PyExc_TypeError, "rows must be int64");
    return nullptr;
  }
  npy_intp height, width;
  if (!Shape(target, "target", &height, &width)) return nullptr;
  const npy_intp n = PyArray_SIZE(rows);
  if (PyArray_SIZE(values) != n * width) {
    PyErr_Format(PyExc_ValueError, "values must hold %zd rows of %zd items, got %zd items",
                 n, width, PyArray_SIZE(values));
    return nullptr;
  }
  const int64_t* row = static_cast<int64_t*>(PyArray_DATA(rows));
  if (!InRange(row, n, height)) return nullptr;  // all checked before any is added
  Py_BEGIN_ALLOW_THREADS
  if (type == NPY_FLOAT32) {
    AddRows(static_cast<float*>(PyArray_DATA(target)), row,
            static_cast<const float*>(PyArray_DATA(values)), n, width,
            static_cast<float>(scale));
  } else {
    AddRows(static_cast<double*>(PyArray_DATA(target)), row,
            static_cast<const double*>(PyArray_DATA(values)), n, width, scale);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// gather(source, rows, out) -> None
PyObject* Gather(PyObject*, PyObject* args) {
  PyObject *source_object, *rows_object, *out_object;
  if (!PyArg_ParseTuple(args, "OOO", &source_object, &rows_object, &out_object)) return nullptr;
  PyArrayObject* source = Contiguous(source_object, false, "source");
  PyArrayObject* rows = source ? Contiguous(rows_object, false, "rows") : nullptr;
  PyArrayObject* out = rows ? Contiguous(out_object, true, "out") : nullptr;
  if (!out) return nullptr;
  if (PyArray_TYPE(rows) != NPY_INT64) {
    PyErr_SetString(PyExc_TypeError, "rows must be int64");
    return nullptr;
  }
  if (!PyArray_EquivTypes(PyArray_DESCR(source), PyArray_DESCR(out)) ||
      PyDataType_REFCHK(PyArray_DESCR(source))) {
    PyErr_SetString(PyExc_TypeError, "out must have source's dtype, one without objects");
    return nullptr;
  }
  npy_intp height, width;
  if (!Shape(source, "source", &height, &width)) return nullptr;
  const npy_intp n = PyArray_SIZE(rows);
  if (PyArray_SIZE(out) != n * width) {
    PyErr_Format(PyExc_ValueError, "out must hold %zd rows of %zd items, got %zd items", n,
                 width, PyArray_SIZE(out));
    return nullptr;
  }
  const int64_t* row = static_cast<int64_t*>(PyArray_DATA(rows));
  if (!InRange(row, n, height)) return nullptr;
  const npy_intp bytes = width * PyArray_ITEMSIZE(source);
  const char* from = static_cast<const char*>(PyArray_DATA(source));
  char* to = static_cast<char*>(PyArray_DATA(out));
  Py_BEGIN_ALLOW_THREADS
  for (npy_intp i = 0; i < n && i < kAhead; ++i) Prefetch(from + row[i] * bytes, bytes);
  for (npy_intp i = 0; i < n; ++i) {
    if (i + kAhead < n) Prefetch(from + row[i + kAhead] * bytes, bytes);
    std::memcpy(to + i * bytes, from + row[i] * bytes, bytes);
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"scatter_add", ScatterAdd, METH_VARARGS,
     "scatter_add(target, rows, values, scale) -> None\n\n"
     "target[rows[i]] += scale * values[i] for each i in turn: `target` a contiguous writable "
     "float32 or float64 array, `rows` int64 within its first dimension (all checked first: "
     "IndexError), `values` as many rows of its dtype."},
    {"gather", Gather, METH_VARARGS,
     "gather(source, rows, out) -> None\n\n"
     "out[i] = source[rows[i]] for each i: `rows` int64 within source's first dimension (all "
     "checked first: IndexError), `out` a contiguous writable array of as many rows, of "
     "source's dtype."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_sparse_rows",
                       "A parameter server's row reads and row updates, compiled.", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__sparse_rows() {
  import_array();
  return PyModule_Create(&kModule);
}
