// Finding and loading libnccl.so.2 at run time (see megalith/comm/nccl.h for the
// search order). Pure C++: it builds with or without CUDA, so the search and its
// error text are tested on any machine.

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "megalith/comm/nccl.h"
#include "megalith/error.h"
#include "nccl_api.h"

namespace megalith::comm {
namespace {

constexpr const char* kSoname = "libnccl.so.2";

std::mutex& loader_mutex() {
  static std::mutex mu;
  return mu;
}

std::string& search_path() {
  static std::string dir;
  return dir;
}

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string in_dir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/" + kSoname;
}

template <class Fn>
bool resolve(void* handle, const char* symbol, Fn*& out, bool required, std::string* missing) {
  out = reinterpret_cast<Fn*>(::dlsym(handle, symbol));
  if (!out && required) {
    if (!missing->empty()) *missing += ", ";
    *missing += symbol;
  }
  return out != nullptr;
}

/// Opens one candidate and fills `api`; on failure returns false with *why set
/// and nothing left open.
bool open_candidate(const std::string& candidate, nccl::Api* api, void** handle_out,
                    std::string* why) {
  ::dlerror();
  void* h = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    std::string text = e ? e : "dlopen failed";
    // dlerror repeats the path first; the list already shows it.
    if (text.rfind(candidate + ": ", 0) == 0) text = text.substr(candidate.size() + 2);
    *why = text;
    return false;
  }
  nccl::Api a;
  std::string missing;
  resolve(h, "ncclGetVersion", a.GetVersion, true, &missing);
  resolve(h, "ncclGetUniqueId", a.GetUniqueId, true, &missing);
  resolve(h, "ncclCommInitRank", a.CommInitRank, true, &missing);
  resolve(h, "ncclCommInitRankConfig", a.CommInitRankConfig, false, &missing);
  resolve(h, "ncclCommAbort", a.CommAbort, true, &missing);
  resolve(h, "ncclCommDestroy", a.CommDestroy, true, &missing);
  resolve(h, "ncclCommGetAsyncError", a.CommGetAsyncError, true, &missing);
  resolve(h, "ncclAllReduce", a.AllReduce, true, &missing);
  resolve(h, "ncclReduceScatter", a.ReduceScatter, true, &missing);
  resolve(h, "ncclAllGather", a.AllGather, true, &missing);
  resolve(h, "ncclBroadcast", a.Broadcast, true, &missing);
  resolve(h, "ncclReduce", a.Reduce, true, &missing);
  resolve(h, "ncclSend", a.Send, true, &missing);
  resolve(h, "ncclRecv", a.Recv, true, &missing);
  resolve(h, "ncclGroupStart", a.GroupStart, true, &missing);
  resolve(h, "ncclGroupEnd", a.GroupEnd, true, &missing);
  resolve(h, "ncclGetErrorString", a.GetErrorString, true, &missing);
  resolve(h, "ncclGetLastError", a.GetLastError, false, &missing);
  if (!missing.empty()) {
    *why = "loaded, but it lacks " + missing + " (not NCCL, or an NCCL older than 2.7)";
    ::dlclose(h);
    return false;
  }
  int code = 0;
  if (a.GetVersion(&code) != nccl::success) {
    *why = "loaded, but ncclGetVersion failed";
    ::dlclose(h);
    return false;
  }
  if (code < kMinNcclVersionCode) {
    *why = "NCCL " + nccl_version_string(code) + " is too old: megalith needs " +
           nccl_version_string(kMinNcclVersionCode) + " or newer";
    ::dlclose(h);
    return false;
  }
  a.version_code = code;
  a.path = candidate;
  *api = a;
  *handle_out = h;
  return true;
}

/// Tries the candidates in order; on success leaves the library open in *handle.
NcclProbe try_candidates(const std::vector<std::string>& candidates, nccl::Api* api,
                         void** handle) {
  NcclProbe probe;
  std::string tried;
  for (const std::string& c : candidates) {
    std::string why;
    if (open_candidate(c, api, handle, &why)) {
      probe.ok = true;
      probe.path = c;
      probe.version_code = api->version_code;
      return probe;
    }
    tried += "\n  - " + c + ": " + why;
  }
  probe.error = "megalith NCCL: could not load " + std::string(kSoname) +
                ". Tried, in order:" + tried +
                "\nInstall it with `pip install nvidia-nccl-cu13` (megalith_comm finds the wheel's "
                "library by itself), or set MEGALITH_NCCL_PATH to libnccl.so.2 or its directory.";
  return probe;
}

// The loaded table; never unloaded (NCCL keeps threads and CUDA state alive).
nccl::Api* g_api = nullptr;

}  // namespace

void set_nccl_search_path(const std::string& dir) {
  std::lock_guard<std::mutex> lock(loader_mutex());
  search_path() = dir;
}

std::vector<std::string> nccl_search_candidates() {
  std::vector<std::string> out;
  auto add = [&out](const std::string& path) {
    for (const std::string& p : out) {
      if (p == path) return;
    }
    out.push_back(path);
  };
  {
    std::lock_guard<std::mutex> lock(loader_mutex());
    if (!search_path().empty()) add(in_dir(search_path()));
  }
  if (const char* env = std::getenv("MEGALITH_NCCL_PATH"); env && *env) {
    add(is_directory(env) ? in_dir(env) : std::string(env));
  }
  if (const char* cuda_home = std::getenv("CUDA_HOME"); cuda_home && *cuda_home) {
    add(in_dir(std::string(cuda_home) + "/lib64"));
  }
  add(in_dir("/usr/local/cuda/lib64"));
  add(kSoname);  // the system loader: LD_LIBRARY_PATH, the ldconfig cache
  return out;
}

NcclProbe probe_nccl(const std::vector<std::string>& candidates) {
  nccl::Api api;
  void* handle = nullptr;
  NcclProbe probe = try_candidates(candidates, &api, &handle);
  if (handle) ::dlclose(handle);
  return probe;
}

std::string nccl_version_string(int code) {
  int major, minor, patch;
  if (code >= 10000) {  // NCCL_VERSION since 2.9: X*10000 + Y*100 + Z
    major = code / 10000;
    minor = (code % 10000) / 100;
    patch = code % 100;
  } else {  // before 2.9: X*1000 + Y*100 + Z
    major = code / 1000;
    minor = (code % 1000) / 100;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

namespace nccl {

const Api* try_api(std::string* why) {
  std::vector<std::string> candidates = nccl_search_candidates();
  std::lock_guard<std::mutex> lock(loader_mutex());
  if (g_api) return g_api;
  auto api = std::make_unique<Api>();
  void* handle = nullptr;
  NcclProbe probe = try_candidates(candidates, api.get(), &handle);
  if (!probe.ok) {
    if (why) *why = probe.error;
    return nullptr;
  }
  g_api = api.release();
  return g_api;
}

const Api& api() {
  std::string why;
  const Api* a = try_api(&why);
  if (!a) throw ::megalith::error(why);
  return *a;
}

const char* result_name(Result r) {
  switch (r) {
    case success:
      return "ncclSuccess";
    case unhandled_cuda_error:
      return "ncclUnhandledCudaError";
    case system_error:
      return "ncclSystemError";
    case internal_error:
      return "ncclInternalError";
    case invalid_argument:
      return "ncclInvalidArgument";
    case invalid_usage:
      return "ncclInvalidUsage";
    case remote_error:
      return "ncclRemoteError";
    case in_progress:
      return "ncclInProgress";
    case timeout:
      return "ncclTimeout";
  }
  return "ncclResult(unknown)";
}

std::string explain(const Api& api, Result r) {
  std::string out = std::string(result_name(r)) + " (" + api.GetErrorString(r) + ")";
  if (api.GetLastError) {
    const char* last = api.GetLastError(nullptr);  // the comm argument is unused by NCCL
    if (last && *last) out += "; NCCL: " + std::string(last);
  }
  return out;
}

}  // namespace nccl
}  // namespace megalith::comm
