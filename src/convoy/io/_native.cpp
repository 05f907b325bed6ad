// convoy.io._native: the wire-format half of parse_example and friends, and the framing of
// TFRecord files, compiled.
//
// parse_columns reads a batch of serialized Example (or SequenceExample) records and returns,
// for each requested key, its column: the records holding the key, the number of values in
// each (or, for feature lists, the steps of each and the values of each step) and all the
// values, in numpy arrays. The Python layer (convoy.io._parsing) turns columns into dense,
// sparse and ragged outputs and words the errors.
//
// Two passes over the batch, each split over a small thread pool with the GIL released:
// the first finds every key's Feature (or FeatureList) in every record, checks it and counts
// its values; the second, once the output arrays are allocated, decodes the values into them.
// Every tag, length and varint is bounds-checked against its enclosing message: the input is
// untrusted.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

enum Kind { kBytes = 1, kFloat = 2, kInt64 = 3 };  // Feature's field numbers

const char kPastEnd[] = "malformed record: a field runs past the end of its message";
const char kTruncated[] = "malformed record: truncated varint";
const char kTooLong[] = "malformed record: a varint longer than 10 bytes";
const char kWireType[] = "malformed record: unknown or group wire type";
const char kFloatLength[] =
    "malformed record: a packed float list of a length not a multiple of 4";
const char kPackedTruncated[] = "malformed record: truncated packed varint";

// The first error of a range of records: its record and what it is.
struct Error {
  int64_t record = INT64_MAX;
  const char* data_loss = nullptr;  // a malformed record: the message
  int key = -1;                     // else a Feature of another kind: the key's index...
  int found = 0;                    // ...and the kind found
};

struct Field {
  uint64_t number;
  int wire;
  const uint8_t* start;  // the payload (wire types 1, 2 and 5)
  const uint8_t* stop;
  uint64_t value;  // wire type 0
};

inline bool ReadVarint(const uint8_t*& p, const uint8_t* end, uint64_t& out,
                       const char*& error) {
  uint64_t value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p >= end) {
      error = kTruncated;
      return false;
    }
    const uint8_t byte = *p++;
    if (shift < 64) value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (byte < 0x80) {
      out = value;
      return true;
    }
  }
  error = kTooLong;
  return false;
}

// Reads the field at p (within a message ending at end) and moves p past it.
inline bool NextField(const uint8_t*& p, const uint8_t* end, Field& field, const char*& error) {
  uint64_t tag;
  if (*p < 0x80) {
    tag = *p++;
  } else if (!ReadVarint(p, end, tag, error)) {
    return false;
  }
  field.number = tag >> 3;
  field.wire = static_cast<int>(tag & 7);
  switch (field.wire) {
    case 0:
      if (!ReadVarint(p, end, field.value, error)) return false;
      field.start = field.stop = p;
      return true;
    case 1:
    case 5: {
      const ptrdiff_t size = field.wire == 1 ? 8 : 4;
      if (end - p < size) {
        error = kPastEnd;
        return false;
      }
      field.start = p;
      p += size;
      field.stop = p;
      return true;
    }
    case 2: {
      uint64_t length;
      if (p < end && *p < 0x80) {
        length = *p++;
      } else if (!ReadVarint(p, end, length, error)) {
        return false;
      }
      if (length > static_cast<uint64_t>(end - p)) {
        error = kPastEnd;
        return false;
      }
      field.start = p;
      p += length;
      field.stop = p;
      return true;
    }
    default:
      error = kWireType;
      return false;
  }
}

// The wanted keys, found by a small open-addressing hash table.
class Keys {
 public:
  explicit Keys(std::vector<std::string> keys) : keys_(std::move(keys)) {
    size_t capacity = 8;
    while (capacity < 2 * keys_.size()) capacity *= 2;
    table_.assign(capacity, -1);
    for (size_t i = 0; i < keys_.size(); ++i) {
      size_t at = Hash(reinterpret_cast<const uint8_t*>(keys_[i].data()), keys_[i].size());
      while (table_[at & (capacity - 1)] >= 0) ++at;
      table_[at & (capacity - 1)] = static_cast<int>(i);
    }
  }

  // The index of the key data[0:size], or -1.
  int Find(const uint8_t* data, size_t size) const {
    const size_t mask = table_.size() - 1;
    for (size_t at = Hash(data, size);; ++at) {
      const int index = table_[at & mask];
      if (index < 0) return -1;
      const std::string& key = keys_[index];
      if (key.size() == size && std::memcmp(key.data(), data, size) == 0) return index;
    }
  }

  size_t size() const { return keys_.size(); }

 private:
  static size_t Hash(const uint8_t* data, size_t size) {
    uint64_t hash = 1469598103934665603ULL ^ size;
    for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 1099511628211ULL;
    return static_cast<size_t>(hash ^ (hash >> 29));
  }

  std::vector<std::string> keys_;
  std::vector<int> table_;
};

// One key in one record: its Feature (or FeatureList) and, once counted, its values and steps
// and where they go in the key's output arrays.
struct Slot {
  const uint8_t* begin = nullptr;  // null: the key is absent
  const uint8_t* end = nullptr;
  int64_t count = 0;
  int64_t steps = 0;
  int64_t row = 0;    // its index among the records holding the key
  int64_t value = 0;  // its first value's index
  int64_t step = 0;   // its first step's index
};

struct Request {
  const Keys* keys;
  std::vector<int> kinds;
  uint64_t field;  // of the record: Example.features, SequenceExample.context (1) or
                   // SequenceExample.feature_lists (2)
  bool lists;      // the map's values are FeatureLists
};

// Counts the values of the Feature [p, end) of `kind`; false on an error.
bool CountFeature(const uint8_t* p, const uint8_t* end, int kind, int64_t& count, Error& error,
                  int key) {
  Field field{};
  while (p < end) {
    if (!NextField(p, end, field, error.data_loss)) return false;
    if (field.wire != 2 || field.number < kBytes || field.number > kInt64) continue;
    if (static_cast<int>(field.number) != kind) {
      error.key = key;
      error.found = static_cast<int>(field.number);
      return false;
    }
    const uint8_t* q = field.start;
    Field item{};
    while (q < field.stop) {
      if (!NextField(q, field.stop, item, error.data_loss)) return false;
      if (item.number != 1) continue;
      if (kind == kBytes) {
        count += item.wire == 2;
      } else if (kind == kFloat) {
        if (item.wire == 2) {
          const ptrdiff_t size = item.stop - item.start;
          if (size % 4) {
            error.data_loss = kFloatLength;
            return false;
          }
          count += size / 4;
        } else {
          count += item.wire == 5;
        }
      } else if (item.wire == 2) {
        int run = 0;
        for (const uint8_t* b = item.start; b < item.stop; ++b) {
          if (*b < 0x80) {
            ++count;
            run = 0;
          } else if (++run >= 10) {
            error.data_loss = kTooLong;
            return false;
          }
        }
        if (run) {
          error.data_loss = kPackedTruncated;
          return false;
        }
      } else {
        count += item.wire == 0;
      }
    }
  }
  return true;
}

// Where each value goes, per kind.
struct Out {
  float* floats = nullptr;
  int64_t* ints = nullptr;
  std::pair<const char*, Py_ssize_t>* strings = nullptr;
};

// Writes the values of the Feature [p, end) (checked by CountFeature) from index `at`.
int64_t FillFeature(const uint8_t* p, const uint8_t* end, int kind, const Out& out, int64_t at) {
  Field field{};
  const char* ignored;
  while (p < end) {
    NextField(p, end, field, ignored);
    if (field.wire != 2 || static_cast<int>(field.number) != kind) continue;
    const uint8_t* q = field.start;
    Field item{};
    while (q < field.stop) {
      NextField(q, field.stop, item, ignored);
      if (item.number != 1) continue;
      if (kind == kBytes) {
        if (item.wire == 2) {
          out.strings[at++] = {reinterpret_cast<const char*>(item.start),
                               item.stop - item.start};
        }
      } else if (kind == kFloat) {
        if (item.wire == 2 || item.wire == 5) {
          const ptrdiff_t size = item.stop - item.start;
          std::memcpy(out.floats + at, item.start, size);  // little-endian hosts
          at += size / 4;
        }
      } else if (item.wire == 2) {
        const uint8_t* b = item.start;
        while (b < item.stop) {
          uint64_t value = 0;
          for (int shift = 0;; shift += 7) {
            const uint8_t byte = *b++;
            if (shift < 64) value |= static_cast<uint64_t>(byte & 0x7F) << shift;
            if (byte < 0x80) break;
          }
          out.ints[at++] = static_cast<int64_t>(value);
        }
      } else if (item.wire == 0) {
        out.ints[at++] = static_cast<int64_t>(item.value);
      }
    }
  }
  return at;
}

// The first pass over one record: finds and counts the wanted keys' values into its slots.
bool ScanRecord(const uint8_t* p, const uint8_t* end, const Request& request, Slot* slots,
                Error& error) {
  const Keys& keys = *request.keys;
  Field field{}, entry{}, part{};
  while (p < end) {
    if (!NextField(p, end, field, error.data_loss)) return false;
    if (field.number != request.field || field.wire != 2) continue;
    const uint8_t* q = field.start;
    while (q < field.stop) {  // the map's entries: key (1) and value (2)
      if (!NextField(q, field.stop, entry, error.data_loss)) return false;
      if (entry.number != 1 || entry.wire != 2) continue;
      const uint8_t *key = entry.stop, *key_end = entry.stop;
      const uint8_t *value = entry.stop, *value_end = entry.stop;
      const uint8_t* e = entry.start;
      while (e < entry.stop) {
        if (!NextField(e, entry.stop, part, error.data_loss)) return false;
        if (part.wire != 2) continue;
        if (part.number == 1) {
          key = part.start;
          key_end = part.stop;
        } else if (part.number == 2) {
          value = part.start;
          value_end = part.stop;
        }
      }
      const int index = keys.Find(key, key_end - key);
      if (index >= 0) {  // a key's last entry wins, as when protobuf reads a map
        slots[index].begin = value;
        slots[index].end = value_end;
      }
    }
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    Slot& slot = slots[k];
    if (!slot.begin) continue;
    const int kind = request.kinds[k];
    if (!request.lists) {
      if (!CountFeature(slot.begin, slot.end, kind, slot.count, error, static_cast<int>(k)))
        return false;
      continue;
    }
    const uint8_t* s = slot.begin;
    while (s < slot.end) {  // FeatureList: its Features (1) are the steps
      if (!NextField(s, slot.end, field, error.data_loss)) return false;
      if (field.number != 1 || field.wire != 2) continue;
      ++slot.steps;
      if (!CountFeature(field.start, field.stop, kind, slot.count, error, static_cast<int>(k)))
        return false;
    }
  }
  return true;
}

struct Column {
  int64_t* rows;
  int64_t* counts;
  int64_t* steps;
  int64_t* indices;  // a VarLenFeature's [record, position] of each value, or null
  Out out;
};

// The second pass over one record: its values, counts and steps into the columns.
void FillRecord(int64_t record, const Request& request, const Slot* slots,
                const std::vector<Column>& columns) {
  for (size_t k = 0; k < columns.size(); ++k) {
    const Slot& slot = slots[k];
    if (!slot.begin) continue;
    const Column& column = columns[k];
    const int kind = request.kinds[k];
    column.rows[slot.row] = record;
    if (!request.lists) {
      column.counts[slot.row] = slot.count;
      FillFeature(slot.begin, slot.end, kind, column.out, slot.value);
      if (column.indices) {
        int64_t* at = column.indices + 2 * slot.value;
        for (int64_t i = 0; i < slot.count; ++i) {
          *at++ = record;
          *at++ = i;
        }
      }
      continue;
    }
    column.steps[slot.row] = slot.steps;
    int64_t at = slot.value, step = slot.step;
    const uint8_t* s = slot.begin;
    Field field{};
    const char* ignored;
    while (s < slot.end) {
      NextField(s, slot.end, field, ignored);
      if (field.number != 1 || field.wire != 2) continue;
      const int64_t next = FillFeature(field.start, field.stop, kind, column.out, at);
      column.counts[step++] = next - at;
      at = next;
    }
  }
}

// A small pool of threads running the tasks of one job at a time; the caller runs tasks too.
class Pool {
 public:
  // Runs task(0) ... task(tasks - 1) over up to `tasks` threads and returns when all are done.
  void Run(int tasks, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (tasks <= 1 || !busy.owns_lock()) {  // in use by another call: this one runs alone
      for (int i = 0; i < tasks; ++i) task(i);
      return;
    }
    Grow(tasks - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      tasks_ = tasks;
      next_ = 0;
      remaining_ = tasks;
      ++generation_;
    }
    wake_.notify_all();
    Work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return remaining_ == 0; });
    task_ = nullptr;
  }

 private:
  void Grow(int workers) {
    while (static_cast<int>(workers_) < workers) {
      std::thread(&Pool::Loop, this).detach();  // lives as long as the process
      ++workers_;
    }
  }

  void Loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
      }
      Work();
    }
  }

  void Work() {
    for (;;) {
      int index;
      const std::function<void(int)>* task;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!task_ || next_ >= tasks_) return;
        index = next_++;
        task = task_;
      }
      (*task)(index);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--remaining_ == 0) done_.notify_all();
    }
  }

  std::mutex busy_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int tasks_ = 0, next_ = 0, remaining_ = 0;
  uint64_t generation_ = 0;
  size_t workers_ = 0;
};

Pool* ThePool() {
  // Threads do not survive fork: a child process starts a pool of its own (the parent's,
  // copied without its threads, is left alone).
  static Pool* pool = nullptr;
  static pid_t owner = 0;
  if (!pool || owner != getpid()) {
    pool = new Pool();
    owner = getpid();
  }
  return pool;
}

constexpr int64_t kRecordsPerTask = 32;

PyObject* NewArray(npy_intp size, int type) {
  return PyArray_SimpleNew(1, &size, type);
}

PyObject* ErrorTuple(const Error& error) {
  if (error.data_loss)
    return Py_BuildValue("(sLs)", "data_loss", static_cast<long long>(error.record),
                         error.data_loss);
  return Py_BuildValue("(sLii)", "kind", static_cast<long long>(error.record), error.key,
                       error.found);
}

// parse_columns(records, keys, kinds, field, lists, threads, sparse) -> (columns, error)
PyObject* ParseColumns(PyObject*, PyObject* args) {
  PyObject *records_arg, *keys_arg, *kinds_arg, *sparse_arg;
  unsigned long long field;
  int lists, threads;
  if (!PyArg_ParseTuple(args, "O!O!O!KpiO!", &PyList_Type, &records_arg, &PyList_Type,
                        &keys_arg, &PyList_Type, &kinds_arg, &field, &lists, &threads,
                        &PyList_Type, &sparse_arg))
    return nullptr;
  const Py_ssize_t batch = PyList_GET_SIZE(records_arg);
  const Py_ssize_t key_count = PyList_GET_SIZE(keys_arg);
  if (PyList_GET_SIZE(kinds_arg) != key_count || PyList_GET_SIZE(sparse_arg) != key_count) {
    PyErr_SetString(PyExc_ValueError, "kinds and sparse must have one entry per key");
    return nullptr;
  }
  std::vector<std::string> key_names;
  Request request;
  for (Py_ssize_t k = 0; k < key_count; ++k) {
    PyObject* key = PyList_GET_ITEM(keys_arg, k);
    const long kind = PyLong_AsLong(PyList_GET_ITEM(kinds_arg, k));
    if (!PyBytes_Check(key) || kind < kBytes || kind > kInt64) {
      PyErr_SetString(PyExc_TypeError, "keys must be bytes and kinds 1, 2 or 3");
      return nullptr;
    }
    key_names.emplace_back(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
    request.kinds.push_back(static_cast<int>(kind));
  }
  const Keys keys(std::move(key_names));
  request.keys = &keys;
  request.field = field;
  request.lists = lists != 0;

  // The records, kept alive while the GIL is released.
  std::vector<PyObject*> held(batch);
  std::vector<std::pair<const uint8_t*, const uint8_t*>> spans(batch);
  for (Py_ssize_t r = 0; r < batch; ++r) {
    PyObject* record = PyList_GET_ITEM(records_arg, r);
    if (!PyBytes_Check(record)) {
      for (Py_ssize_t i = 0; i < r; ++i) Py_DECREF(held[i]);
      PyErr_Format(PyExc_TypeError, "records[%zd] must be bytes", r);
      return nullptr;
    }
    Py_INCREF(record);
    held[r] = record;
    const auto* data = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(record));
    spans[r] = {data, data + PyBytes_GET_SIZE(record)};
  }
  struct Release {
    std::vector<PyObject*>& held;
    ~Release() {
      for (PyObject* record : held) Py_DECREF(record);
    }
  } release{held};

  const int tasks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(std::max(threads, 1), (batch + kRecordsPerTask - 1) / kRecordsPerTask)));
  auto bounds = [&](int task) {
    return std::make_pair(batch * task / tasks, batch * (task + 1) / tasks);
  };
  std::vector<Slot> slots(static_cast<size_t>(batch) * key_count);
  std::vector<Error> errors(tasks);
  Pool* pool = ThePool();  // with the GIL held: calls from several threads share one pool
  Py_BEGIN_ALLOW_THREADS
  pool->Run(tasks, [&](int task) {
    auto [first, last] = bounds(task);
    for (int64_t r = first; r < last; ++r) {
      if (!ScanRecord(spans[r].first, spans[r].second, request, &slots[r * key_count],
                      errors[task])) {
        errors[task].record = r;
        return;
      }
    }
  });
  Py_END_ALLOW_THREADS
  for (const Error& error : errors) {
    if (error.record != INT64_MAX) return Py_BuildValue("(ON)", Py_None, ErrorTuple(error));
  }

  // Where each record's values go, then the output arrays.
  std::vector<int64_t> rows(key_count), values(key_count), steps(key_count), widest(key_count);
  for (Py_ssize_t r = 0; r < batch; ++r) {
    for (Py_ssize_t k = 0; k < key_count; ++k) {
      Slot& slot = slots[r * key_count + k];
      if (!slot.begin) continue;
      widest[k] = std::max(widest[k], slot.count);
      slot.row = rows[k]++;
      slot.value = values[k];
      values[k] += slot.count;
      slot.step = steps[k];
      steps[k] += slot.steps;
    }
  }
  PyObject* result = PyList_New(key_count);
  if (!result) return nullptr;
  std::vector<Column> columns(key_count);
  std::vector<std::vector<std::pair<const char*, Py_ssize_t>>> strings(key_count);
  for (Py_ssize_t k = 0; k < key_count; ++k) {
    const int kind = request.kinds[k];
    PyObject* row_array = NewArray(rows[k], NPY_INT64);
    PyObject* count_array = NewArray(request.lists ? steps[k] : rows[k], NPY_INT64);
    PyObject* value_array = NewArray(
        values[k], kind == kFloat ? NPY_FLOAT32 : kind == kInt64 ? NPY_INT64 : NPY_OBJECT);
    PyObject* step_array = request.lists ? NewArray(rows[k], NPY_INT64) : Py_NewRef(Py_None);
    const bool sparse = !request.lists && PyObject_IsTrue(PyList_GET_ITEM(sparse_arg, k)) == 1;
    PyObject* index_array = nullptr;
    if (sparse) {
      npy_intp shape[2] = {values[k], 2};
      index_array = PyArray_SimpleNew(2, shape, NPY_INT64);
    } else {
      index_array = Py_NewRef(Py_None);
    }
    // The count of every record, when every record holds the key with the same count.
    long long uniform = -1;
    if (!request.lists && rows[k] == batch && batch) {
      uniform = slots[k].count;
      for (Py_ssize_t r = 1; r < batch && uniform >= 0; ++r)
        if (slots[r * key_count + k].count != uniform) uniform = -1;
    }
    PyObject* column = (row_array && count_array && value_array && step_array && index_array)
                           ? Py_BuildValue("(OOOOLOL)", row_array, count_array, value_array,
                                           step_array, uniform, index_array,
                                           static_cast<long long>(widest[k]))
                           : nullptr;
    Py_XDECREF(index_array);
    Py_XDECREF(row_array);
    Py_XDECREF(count_array);
    Py_XDECREF(value_array);
    Py_XDECREF(step_array);
    if (!column) {
      Py_DECREF(result);
      return nullptr;
    }
    PyList_SET_ITEM(result, k, column);
    Column& out = columns[k];
    out.rows = static_cast<int64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(row_array)));
    out.counts =
        static_cast<int64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(count_array)));
    out.indices = sparse ? static_cast<int64_t*>(PyArray_DATA(
                               reinterpret_cast<PyArrayObject*>(index_array)))
                         : nullptr;
    out.steps = request.lists ? static_cast<int64_t*>(PyArray_DATA(
                                    reinterpret_cast<PyArrayObject*>(step_array)))
                              : nullptr;
    void* data = PyArray_DATA(reinterpret_cast<PyArrayObject*>(value_array));
    if (kind == kFloat) {
      out.out.floats = static_cast<float*>(data);
    } else if (kind == kInt64) {
      out.out.ints = static_cast<int64_t*>(data);
    } else {
      strings[k].resize(values[k]);
      out.out.strings = strings[k].data();
    }
  }
  Py_BEGIN_ALLOW_THREADS
  pool->Run(tasks, [&](int task) {
    auto [first, last] = bounds(task);
    for (int64_t r = first; r < last; ++r) FillRecord(r, request, &slots[r * key_count], columns);
  });
  Py_END_ALLOW_THREADS
  for (Py_ssize_t k = 0; k < key_count; ++k) {
    if (request.kinds[k] != kBytes) continue;
    PyObject* column = PyList_GET_ITEM(result, k);
    auto* array = reinterpret_cast<PyArrayObject*>(PyTuple_GET_ITEM(column, 2));
    auto** items = static_cast<PyObject**>(PyArray_DATA(array));
    for (int64_t i = 0; i < values[k]; ++i) {
      PyObject* item = PyBytes_FromStringAndSize(strings[k][i].first, strings[k][i].second);
      if (!item) {
        Py_DECREF(result);
        return nullptr;
      }
      Py_XSETREF(items[i], item);
    }
  }
  return Py_BuildValue("(NO)", result, Py_None);
}

// ----- TFRecord framing: each record is its length (8 bytes), the masked CRC32C of the length
// (4), the data and the masked CRC32C of the data (4), all little-endian.

uint32_t kCrcTable[256];

void InitCrcTable() {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
    kCrcTable[i] = crc;
  }
}

uint32_t Crc32cTable(uint32_t crc, const uint8_t* p, size_t size) {
  for (size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const uint8_t* p,
                                                        size_t size) {
  uint64_t wide = crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    wide = __builtin_ia32_crc32di(wide, word);
  }
  crc = static_cast<uint32_t>(wide);
  for (; size; --size) crc = __builtin_ia32_crc32qi(crc, *p++);
  return crc;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#else
const bool kHaveSse42 = false;
#endif

uint32_t MaskedCrc32c(const uint8_t* p, size_t size) {
#if defined(__x86_64__)
  const uint32_t crc = ~(kHaveSse42 ? Crc32cSse42(~0u, p, size) : Crc32cTable(~0u, p, size));
#else
  const uint32_t crc = ~Crc32cTable(~0u, p, size);
#endif
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

inline uint64_t Little64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, 8);
  return value;
}

inline uint32_t Little32(const uint8_t* p) {
  uint32_t value;
  std::memcpy(&value, p, 4);
  return value;
}

// split_records(chunk, at) -> (records, at, error)
PyObject* SplitRecords(PyObject*, PyObject* args) {
  Py_buffer view;
  Py_ssize_t at;
  if (!PyArg_ParseTuple(args, "y*n", &view, &at)) return nullptr;
  const auto* data = static_cast<const uint8_t*>(view.buf);
  const size_t size = static_cast<size_t>(view.len);
  size_t position = at < 0 ? 0 : std::min(static_cast<size_t>(at), size);
  std::vector<std::pair<size_t, size_t>> records;
  const char* error = nullptr;
  Py_BEGIN_ALLOW_THREADS
  while (position + 12 <= size) {
    const uint8_t* header = data + position;
    if (MaskedCrc32c(header, 8) != Little32(header + 8)) {
      error = "length CRC mismatch";
      break;
    }
    const uint64_t length = Little64(header);
    if (length > size - position - 12 || size - position - 12 - length < 4) break;  // unfinished
    const uint8_t* record = header + 12;
    if (MaskedCrc32c(record, length) != Little32(record + length)) {
      error = "data CRC mismatch";
      break;
    }
    records.emplace_back(position + 12, length);
    position += 16 + length;
  }
  Py_END_ALLOW_THREADS
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(records.size()));
  for (size_t i = 0; list && i < records.size(); ++i) {
    PyObject* record = PyBytes_FromStringAndSize(
        reinterpret_cast<const char*>(data + records[i].first), records[i].second);
    if (!record) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, record);
  }
  PyBuffer_Release(&view);
  if (!list) return nullptr;
  return Py_BuildValue("(Nnz)", list, static_cast<Py_ssize_t>(position), error);
}

PyMethodDef kMethods[] = {
    {"parse_columns", ParseColumns, METH_VARARGS,
     "parse_columns(records, keys, kinds, field, lists, threads, sparse) -> (columns, error)\n\n"
     "The column of each key (bytes) of the given kind (1 bytes, 2 float, 3 int64) in the map "
     "at field `field` of each record: (rows, counts, values, steps, uniform, indices, "
     "widest): uniform is the count of every record if all hold the key with one count, else "
     "-1; indices (for the keys flagged in `sparse`, else None) the [record, position] of "
     "each value; widest the largest count. `lists`: the map's values "
     "are FeatureLists (counts are per step, steps per row). `threads`: at most this many "
     "threads. error: None, ('data_loss', record, message) or ('kind', record, key index, "
     "kind found)."},
    {"split_records", SplitRecords, METH_VARARGS,
     "split_records(chunk, at) -> (records, at, error)\n\n"
     "The whole TFRecord records of `chunk` from offset `at`, their CRCs checked: the records "
     "(bytes), the offset after the last, and None, or the error that stopped the split there "
     "('length CRC mismatch' or 'data CRC mismatch')."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_native",
                       "The compiled wire-format reader of convoy.io's parsers.", -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  import_array();
  InitCrcTable();
  return PyModule_Create(&kModule);
}
