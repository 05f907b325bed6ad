// convoy.distribute._row_index: the hash index of a dynamic embedding table's rows on one
// store (convoy.distribute._dynamic_rows.DynamicRows), compiled.
//
// The index is an open-addressing table (linear probing) of row numbers: EMPTY (-1) ends a
// search, TOMBSTONE (-2) marks a removed row and is skipped. An id's search starts at
// SplitMix64(id) masked to the index's size (a power of two). `keys[row]` is the id of row
// `row`. The loops run with the GIL released: the caller guarantees that nobody else
// changes these arrays meanwhile (the store runs one operation at a time).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstdint>

namespace {

constexpr int64_t kEmpty = -1;

inline uint64_t Mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return z;
}

// `object` as a C-contiguous, aligned array of `type` (writable if asked), else nullptr with
// a TypeError naming `what`.
PyArrayObject* Checked(PyObject* object, int type, bool writable, const char* what) {
  if (!PyArray_Check(object)) {
    PyErr_Format(PyExc_TypeError, "%s must be a numpy array", what);
    return nullptr;
  }
  auto* array = reinterpret_cast<PyArrayObject*>(object);
  int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
  if (PyArray_TYPE(array) != type || !PyArray_CHKFLAGS(array, flags) || PyArray_NDIM(array) != 1) {
    PyErr_Format(PyExc_TypeError, "%s must be a flat contiguous%s array of the right dtype",
                 what, writable ? " writable" : "");
    return nullptr;
  }
  return array;
}

struct Index {
  PyArrayObject* array;
  bool wide;  // int64 entries, else int32
  uint64_t mask;

  int64_t At(uint64_t at) const {
    return wide ? static_cast<int64_t*>(PyArray_DATA(array))[at]
                : static_cast<int32_t*>(PyArray_DATA(array))[at];
  }
  void Set(uint64_t at, int64_t row) const {
    if (wide) {
      static_cast<int64_t*>(PyArray_DATA(array))[at] = row;
    } else {
      static_cast<int32_t*>(PyArray_DATA(array))[at] = static_cast<int32_t>(row);
    }
  }
};

bool Open(PyObject* object, Index* index) {
  if (!PyArray_Check(object)) {
    PyErr_SetString(PyExc_TypeError, "index must be a numpy array");
    return false;
  }
  auto* array = reinterpret_cast<PyArrayObject*>(object);
  int type = PyArray_TYPE(array);
  if (type != NPY_INT64 && type != NPY_INT32) {
    PyErr_SetString(PyExc_TypeError, "index must be an int32 or int64 array");
    return false;
  }
  if (!Checked(object, type, true, "index")) return false;
  npy_intp size = PyArray_SIZE(array);
  if (size < 1 || (size & (size - 1)) != 0) {
    PyErr_SetString(PyExc_ValueError, "index's size must be a power of two");
    return false;
  }
  *index = Index{array, type == NPY_INT64, static_cast<uint64_t>(size - 1)};
  return true;
}

// probe(index, keys, ids, found, position) -> None: found[i] is the row of ids[i] (-1 if
// none), position[i] the index position where its search ended (its entry, or the EMPTY
// entry that ended it).
PyObject* Probe(PyObject*, PyObject* args) {
  PyObject *index_object, *keys_object, *ids_object, *found_object, *position_object;
  if (!PyArg_ParseTuple(args, "OOOOO", &index_object, &keys_object, &ids_object, &found_object,
                        &position_object)) {
    return nullptr;
  }
  Index index;
  if (!Open(index_object, &index)) return nullptr;
  PyArrayObject* keys = Checked(keys_object, NPY_INT64, false, "keys");
  PyArrayObject* ids = keys ? Checked(ids_object, NPY_INT64, false, "ids") : nullptr;
  PyArrayObject* found = ids ? Checked(found_object, NPY_INT64, true, "found") : nullptr;
  PyArrayObject* position =
      found ? Checked(position_object, NPY_INT64, true, "position") : nullptr;
  if (!position) return nullptr;
  npy_intp n = PyArray_SIZE(ids);
  if (PyArray_SIZE(found) != n || PyArray_SIZE(position) != n) {
    PyErr_SetString(PyExc_ValueError, "found and position must be as long as ids");
    return nullptr;
  }
  const int64_t* key = static_cast<int64_t*>(PyArray_DATA(keys));
  const int64_t* id = static_cast<int64_t*>(PyArray_DATA(ids));
  int64_t* found_at = static_cast<int64_t*>(PyArray_DATA(found));
  int64_t* ended_at = static_cast<int64_t*>(PyArray_DATA(position));
  const int64_t rows = PyArray_SIZE(keys);
  bool corrupt = false;
  Py_BEGIN_ALLOW_THREADS
  for (npy_intp i = 0; i < n && !corrupt; ++i) {
    uint64_t at = Mix64(static_cast<uint64_t>(id[i])) & index.mask;
    int64_t result = -1;
    for (uint64_t steps = 0;; ++steps) {
      int64_t row = index.At(at);
      if (row == kEmpty) break;
      if (row >= rows || steps > index.mask) {  // a row past the keys, or no EMPTY entry
        corrupt = true;
        break;
      }
      if (row >= 0 && key[row] == id[i]) {
        result = row;
        break;
      }
      at = (at + 1) & index.mask;
    }
    found_at[i] = result;
    ended_at[i] = static_cast<int64_t>(at);
  }
  Py_END_ALLOW_THREADS
  if (corrupt) {
    PyErr_SetString(PyExc_RuntimeError, "the row index is corrupt");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// insert(index, ids, rows) -> int: puts each rows[i] (of the distinct ids[i], none in the
// index) at the first free entry (EMPTY or TOMBSTONE) of its id's search; returns how many
// EMPTY entries it took. The caller leaves room (the index at most half full).
PyObject* Insert(PyObject*, PyObject* args) {
  PyObject *index_object, *ids_object, *rows_object;
  if (!PyArg_ParseTuple(args, "OOO", &index_object, &ids_object, &rows_object)) return nullptr;
  Index index;
  if (!Open(index_object, &index)) return nullptr;
  PyArrayObject* ids = Checked(ids_object, NPY_INT64, false, "ids");
  PyArrayObject* rows = ids ? Checked(rows_object, NPY_INT64, false, "rows") : nullptr;
  if (!rows) return nullptr;
  npy_intp n = PyArray_SIZE(ids);
  if (PyArray_SIZE(rows) != n) {
    PyErr_SetString(PyExc_ValueError, "rows must be as long as ids");
    return nullptr;
  }
  const int64_t* id = static_cast<int64_t*>(PyArray_DATA(ids));
  const int64_t* row = static_cast<int64_t*>(PyArray_DATA(rows));
  long long taken = 0;
  bool full = false;
  Py_BEGIN_ALLOW_THREADS
  for (npy_intp i = 0; i < n && !full; ++i) {
    uint64_t at = Mix64(static_cast<uint64_t>(id[i])) & index.mask;
    uint64_t steps = 0;
    int64_t entry;
    while ((entry = index.At(at)) >= 0) {
      if (++steps > index.mask) {
        full = true;
        break;
      }
      at = (at + 1) & index.mask;
    }
    if (full) break;
    taken += entry == kEmpty;
    index.Set(at, row[i]);
  }
  Py_END_ALLOW_THREADS
  if (full) {
    PyErr_SetString(PyExc_RuntimeError, "the row index is full");
    return nullptr;
  }
  return PyLong_FromLongLong(taken);
}

PyMethodDef kMethods[] = {
    {"probe", Probe, METH_VARARGS,
     "probe(index, keys, ids, found, position) -> None\n\n"
     "For each of the int64 `ids`: its row in `found` (-1 if the index has none) and in "
     "`position` the index entry where its search ended."},
    {"insert", Insert, METH_VARARGS,
     "insert(index, ids, rows) -> int\n\n"
     "Index each of `rows` under its id in `ids` (distinct, absent); the EMPTY entries taken."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_row_index",
                       "The compiled hash index of a dynamic embedding table's rows.", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__row_index() {
  import_array();
  return PyModule_Create(&kModule);
}
