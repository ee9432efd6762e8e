// megalith._engine.memory: the engine's memory resources, buffers and chunks.
// Resources, buffers and chunks are shared with C++ (std::shared_ptr), so a
// Python object keeps what it uses alive. Views are DLPack arrays
// (torch.from_dlpack(buf.view("f32", n)) aliases the memory) whose owner
// holds the storage they point into: storage is freed only when its buffer
// or chunk let go of it and no view remains. The GIL is released around
// allocations, copies and waits.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "megalith/dtype.h"
#include "megalith/error.h"
#include "megalith/memory/buffer.h"
#include "megalith/memory/capacity_search.h"
#include "megalith/memory/chunk_store.h"
#include "megalith/memory/device_resource.h"
#include "megalith/memory/host_resource.h"
#include "megalith/memory/limiting_adaptor.h"
#include "megalith/memory/pinned_host_resource.h"
#include "megalith/memory/pool_resource.h"
#include "megalith/memory/statistics_adaptor.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace megalith::bindings {
namespace {

using namespace megalith::memory;
using ResourcePtr = std::shared_ptr<Resource>;
using BufferPtr = std::shared_ptr<Buffer>;

nb::dlpack::dtype dlpack_dtype(DType t) {
  using code = nb::dlpack::dtype_code;
  auto make = [](code c, int bits) {
    return nb::dlpack::dtype{static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(bits), 1};
  };
  switch (t) {
    case DType::f32:
      return make(code::Float, 32);
    case DType::f16:
      return make(code::Float, 16);
    case DType::bf16:
      return make(code::Bfloat, 16);
    case DType::f64:
      return make(code::Float, 64);
    case DType::i8:
      return make(code::Int, 8);
    case DType::u8:
      return make(code::UInt, 8);
    case DType::i32:
      return make(code::Int, 32);
    case DType::i64:
      return make(code::Int, 64);
  }
  MEGALITH_FAIL(invalid_argument, "unknown dtype");
}

using View = nb::ndarray<nb::array_api>;  // an object with __dlpack__ and the buffer protocol

/// The names of dtype.h's DType values ("f32", "u8", ...), then dtype_from_name's spellings.
DType view_dtype(const std::string& name) {
  static const std::pair<const char*, DType> short_names[] = {
      {"f32", DType::f32}, {"f16", DType::f16}, {"bf16", DType::bf16}, {"f64", DType::f64},
      {"i8", DType::i8},   {"u8", DType::u8},   {"i32", DType::i32},   {"i64", DType::i64}};
  for (const auto& [n, t] : short_names) {
    if (name == n) return t;
  }
  try {
    return dtype_from_name(name);
  } catch (const invalid_argument&) {
    MEGALITH_FAIL(invalid_argument, "view: unknown dtype '", name,
                  "': expected f32, f16, bf16, f64, i8, u8, i32 or i64");
  }
}

/// A 1-D array of `count` x `dtype` at `offset` bytes into `storage`, owning a reference to it.
View view_of(const BufferPtr& storage, std::size_t extent, const std::string& dtype,
             std::size_t count, std::size_t offset, const std::string& what) {
  const DType t = view_dtype(dtype);
  const std::size_t esize = dtype_size(t);
  MEGALITH_EXPECTS(offset % esize == 0, invalid_argument, what, ".view: offset_bytes ", offset,
                   " is not a multiple of the ", dtype_name(t), " element size ", esize);
  MEGALITH_EXPECTS(offset <= extent && count <= (extent - offset) / esize, invalid_argument, what,
                   ".view: ", count, " x ", dtype_name(t), " (", count * esize,
                   " bytes) at offset ", offset, " goes past the end (", extent, " bytes)");
  auto* holder = new BufferPtr(storage);
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<BufferPtr*>(p); });
  const std::size_t shape[1] = {count};
  const bool on_gpu = storage->tier() == Tier::device;
  return View(static_cast<char*>(storage->data()) + offset, 1, shape, owner, nullptr,
              dlpack_dtype(t), on_gpu ? nb::device::cuda::value : nb::device::cpu::value,
              on_gpu ? storage->device() : 0);
}

std::string buffer_repr(const Buffer& b) {
  std::string where = tier_name(b.tier());
  if (b.device() >= 0) where += " cuda:" + std::to_string(b.device());
  return "<megalith Buffer " + format_bytes(b.nbytes()) + " on " + where + ">";
}

std::string chunk_repr(const Chunk& c) {
  return "<megalith Chunk " + std::to_string(c.id()) + ": " + format_bytes(c.capacity()) + ", " +
         std::to_string(c.used_bytes()) + " bytes used, " +
         (c.resident() ? std::string("on ") : std::string("released, last on ")) +
         tier_name(c.tier()) + ">";
}

void bind_resources(nb::module_& m) {
  nb::enum_<Tier>(m, "Tier", "Where memory lives")
      .value("device", Tier::device, "GPU memory")
      .value("pinned_host", Tier::pinned_host, "page-locked host memory (fast GPU copies)")
      .value("host", Tier::host, "pageable host memory")
      .def("__str__", [](Tier t) { return tier_name(t); });

  nb::class_<Resource>(m, "Resource", "A memory resource: allocates buffers on one tier")
      .def_prop_ro("tier", &Resource::tier)
      .def_prop_ro("device", &Resource::device, "CUDA device of device memory; -1 for host tiers")
      .def_prop_ro("name", &Resource::name)
      .def(
          "allocate",
          [](const ResourcePtr& self, std::size_t nbytes, std::size_t alignment) {
            nb::gil_scoped_release release;
            return Buffer::allocate(self, nbytes, alignment);
          },
          "nbytes"_a, "alignment"_a = kDefaultAlignment,
          "A Buffer of `nbytes`, freed when the last reference (views included) is gone. "
          "Raises MemoryError naming the bytes asked for and the bytes free.")
      .def("__repr__", [](const Resource& r) { return "<megalith Resource " + r.name() + ">"; });

  nb::class_<HostResource, Resource>(m, "HostResource", "Pageable host memory").def(nb::init<>());
  nb::class_<PinnedHostResource, Resource>(m, "PinnedHostResource",
                                           "Page-locked host memory (needs CUDA and a GPU)")
      .def(nb::init<>());
  nb::class_<DeviceResource, Resource>(m, "DeviceResource", "GPU memory through cudaMalloc")
      .def(nb::init<int>(), "device"_a);
  nb::class_<PoolResource, Resource>(
      m, "PoolResource",
      "Keeps freed memory for reuse (best fit with coalescing over blocks of block_bytes from "
      "upstream; max_bytes caps what it holds, 0 = no cap)")
      .def(nb::init<ResourcePtr, std::size_t, std::size_t>(), "upstream"_a,
           "block_bytes"_a = std::size_t{64} << 20, "max_bytes"_a = 0)
      .def_prop_ro("upstream", &PoolResource::upstream)
      .def_prop_ro("block_bytes", &PoolResource::block_bytes)
      .def_prop_ro("max_bytes", &PoolResource::max_bytes)
      .def_prop_ro("held_bytes", &PoolResource::held_bytes, "bytes taken from upstream")
      .def_prop_ro("used_bytes", &PoolResource::used_bytes, "bytes handed out (256-byte granules)")
      .def("release_unused", &PoolResource::release_unused,
           "Returns entirely free blocks to upstream; gives the bytes returned.");
  nb::class_<StatisticsAdaptor, Resource>(m, "StatisticsAdaptor",
                                          "Counts bytes in use, their peak and allocations")
      .def(nb::init<ResourcePtr>(), "upstream"_a)
      .def_prop_ro("upstream", &StatisticsAdaptor::upstream)
      .def_prop_ro("current_bytes", &StatisticsAdaptor::current_bytes)
      .def_prop_ro("peak_bytes", &StatisticsAdaptor::peak_bytes)
      .def_prop_ro("allocations", &StatisticsAdaptor::allocations,
                   "allocations made since construction")
      .def_prop_ro("live_allocations",
                   [](const StatisticsAdaptor& s) { return s.stats().live_allocations; })
      .def("reset_peak", &StatisticsAdaptor::reset_peak);
  nb::class_<LimitingAdaptor, Resource>(m, "LimitingAdaptor",
                                        "Refuses allocations past limit_bytes in use")
      .def(nb::init<ResourcePtr, std::size_t>(), "upstream"_a, "limit_bytes"_a)
      .def_prop_ro("upstream", &LimitingAdaptor::upstream)
      .def_prop_ro("limit_bytes", &LimitingAdaptor::limit_bytes)
      .def_prop_ro("used_bytes", &LimitingAdaptor::used_bytes);

  nb::class_<Buffer>(m, "Buffer", "One allocation, freed when the last reference is gone")
      .def_prop_ro("nbytes", &Buffer::nbytes)
      .def_prop_ro("tier", &Buffer::tier)
      .def_prop_ro("device", &Buffer::device)
      .def_prop_ro("alignment", &Buffer::alignment)
      .def_prop_ro("data_ptr",
                   [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data()); })
      .def(
          "view",
          [](const BufferPtr& self, const std::string& dtype, std::size_t count,
             std::size_t offset_bytes) {
            return view_of(self, self->nbytes(), dtype, count, offset_bytes, "Buffer");
          },
          "dtype"_a, "count"_a, "offset_bytes"_a = 0,
          "A 1-D DLPack array of `count` x `dtype` (\"f32\", \"bf16\", ...) at `offset_bytes` "
          "that keeps the buffer alive.")
      .def("__repr__", &buffer_repr);
}

void bind_chunks(nb::module_& m) {
  m.def(
      "search_chunk_capacity",
      [](const std::vector<std::size_t>& tensor_bytes, std::size_t min_capacity,
         std::size_t max_capacity, std::size_t alignment) {
        CapacityChoice c;
        {
          nb::gil_scoped_release release;
          c = search_chunk_capacity(tensor_bytes, min_capacity, max_capacity, alignment);
        }
        return nb::make_tuple(c.capacity, c.wasted_bytes);
      },
      "tensor_bytes"_a, "min_capacity"_a, "max_capacity"_a, "alignment"_a = kDefaultAlignment,
      nb::sig("def search_chunk_capacity(tensor_bytes: list[int], min_capacity: int, "
              "max_capacity: int, alignment: int = 256) -> tuple[int, int]"),
      "(capacity, wasted_bytes) minimising the wasted bytes when the tensors are placed in "
      "order at aligned offsets, never spanning chunks; fewer chunks among ties.");
  m.def("count_chunks", &count_chunks, "tensor_bytes"_a, "capacity"_a,
        "alignment"_a = kDefaultAlignment, "Chunks the placement rule needs at `capacity`.");

  nb::class_<Chunk>(m, "Chunk", "Fixed-capacity storage that tensors are placed into")
      .def_prop_ro("id", &Chunk::id)
      .def_prop_ro("capacity", &Chunk::capacity)
      .def_prop_ro("used_bytes", &Chunk::used_bytes)
      .def_prop_ro("tier", &Chunk::tier)
      .def_prop_ro("resident", &Chunk::resident)
      .def_prop_ro("data_ptr",
                   [](const Chunk& c) { return reinterpret_cast<std::uintptr_t>(c.data()); })
      .def(
          "fits",
          [](const Chunk& c, std::size_t nbytes, std::optional<std::size_t> alignment) {
            return c.fits(nbytes, alignment.value_or(0));
          },
          "nbytes"_a, "alignment"_a = nb::none())
      .def(
          "place",
          [](Chunk& c, std::size_t nbytes, std::optional<std::size_t> alignment) {
            return c.place(nbytes, alignment.value_or(0));
          },
          "nbytes"_a, "alignment"_a = nb::none(),
          "Reserves `nbytes` at the next aligned offset (default: the store's alignment) and "
          "returns the offset; ValueError when it does not fit.")
      .def(
          "view",
          [](const Chunk& c, const std::string& dtype, std::size_t count, std::size_t offset) {
            BufferPtr storage = c.storage();
            MEGALITH_EXPECTS(storage != nullptr, invalid_argument, "chunk ", c.id(),
                             ".view: the chunk is not resident (allocate(tier) gives it storage)");
            return view_of(storage, c.capacity(), dtype, count, offset,
                           "chunk " + std::to_string(c.id()));
          },
          "dtype"_a, "count"_a, "offset_bytes"_a = 0,
          "A 1-D DLPack array into the current storage; it keeps that storage alive.")
      .def(
          "move_to",
          [](Chunk& c, Tier tier, std::uintptr_t stream) {
            nb::gil_scoped_release release;
            c.move_to(tier, reinterpret_cast<void*>(stream));
          },
          "tier"_a, "stream"_a = 0,
          "Copies the chunk to fresh storage on `tier`, asynchronously on `stream` (a "
          "cudaStream_t as int, 0: default stream) when the device is involved.")
      .def(
          "synchronize",
          [](Chunk& c) {
            nb::gil_scoped_release release;
            c.synchronize();
          },
          "Waits for the last copy and frees the storage it kept alive.")
      .def(
          "release",
          [](Chunk& c) {
            nb::gil_scoped_release release;
            c.release();
          },
          "Drops the storage: not resident, contents lost (placement is kept).")
      .def(
          "allocate",
          [](Chunk& c, Tier tier) {
            nb::gil_scoped_release release;
            c.allocate(tier);
          },
          "tier"_a, "Fresh uninitialised storage on `tier` for a chunk that is not resident.")
      .def("__repr__", &chunk_repr);

  nb::class_<ChunkStore>(m, "ChunkStore", "Makes chunks of one capacity on per-tier resources")
      .def(
          "__init__",
          [](ChunkStore* self, std::size_t capacity, ResourcePtr host, ResourcePtr pinned_host,
             ResourcePtr device, std::size_t alignment) {
            new (self) ChunkStore(capacity, TierResources{host, pinned_host, device}, alignment);
          },
          "capacity"_a, "host"_a.none() = nb::none(), "pinned_host"_a.none() = nb::none(),
          "device"_a.none() = nb::none(), "alignment"_a = kDefaultAlignment)
      .def_prop_ro("capacity", &ChunkStore::capacity)
      .def_prop_ro("alignment", &ChunkStore::alignment)
      .def("has_tier", &ChunkStore::has_tier, "tier"_a)
      .def(
          "new_chunk",
          [](ChunkStore& s, Tier tier) {
            nb::gil_scoped_release release;
            return s.new_chunk(tier);
          },
          "tier"_a)
      .def(
          "stats",
          [](const ChunkStore& s, Tier tier) {
            MemoryStats st = s.stats(tier);
            nb::dict d;
            d["current_bytes"] = st.current_bytes;
            d["peak_bytes"] = st.peak_bytes;
            d["allocations"] = st.allocations;
            return d;
          },
          "tier"_a, nb::sig("def stats(self, tier: Tier) -> dict[str, int]"),
          "current_bytes, peak_bytes and allocations of chunk storage on `tier` (zeros for a "
          "tier the store has no resource for)")
      .def("reset_peak", &ChunkStore::reset_peak);
}

}  // namespace

void bind_memory(nb::module_& m) {
  nb::module_ mem = m.def_submodule(
      "memory", "Memory resources, buffers and chunks of the engine (megalith::memory)");
  bind_resources(mem);
  bind_chunks(mem);
}

}  // namespace megalith::bindings
