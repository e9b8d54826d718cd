// The launch logic both forms share (see launch.h).
#include "launch.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "check.h"
#include "cuda_driver.h"
#include "dynlib.h"

namespace fa_binding {
namespace {

constexpr double kLog2e = 1.4426950408889634;  // log2(e)
constexpr size_t kLaunchInts = 5;   // per entry: threads, block_m, block_n, smem_bytes, grid
constexpr int kDefaultSmemLimit = 48 * 1024;  // above this a kernel must opt in (cuFuncSetAttribute)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void check_cuda(CUresult result, const std::string& what) {
  FA_CHECK(result == 0, what, " failed: ", error_text(result));
}

std::string device_name(const View& t) {
  return t.cuda ? "cuda:" + std::to_string(t.device) : std::string("cpu");
}

// ---- torch's current stream -------------------------------------------------------------------
// torch's C shim (torch/csrc/inductor/aoti_torch/c/shim.h, since 2.4) exports this extern "C"
// function from libtorch_cuda.so, which `import torch` has already loaded; resolving it at run time
// keeps libtorch_cuda out of our DT_NEEDED list, so the binding also loads into a CPU-only torch.
using GetStreamFn = int32_t (*)(int32_t device_index, void** ret_stream);

GetStreamFn stream_getter() {
  static const GetStreamFn fn = [] {
    void* sym = nullptr;
    if (void* lib = dynlib::loaded(dynlib::kTorchCuda)) {
      sym = dynlib::symbol(lib, "aoti_torch_get_current_cuda_stream");
    }
    if (sym == nullptr) {
      sym = dynlib::any_loaded_symbol("aoti_torch_get_current_cuda_stream");
    }
    return reinterpret_cast<GetStreamFn>(sym);
  }();
  FA_CHECK(fn != nullptr, "torch's aoti_torch_get_current_cuda_stream was not found; "
           "this torch build has no CUDA support (install a CUDA build of torch)");
  return fn;
}

CUstream current_stream(int device) {
  void* stream = nullptr;
  FA_CHECK(stream_getter()(device, &stream) == 0, "could not get torch's current CUDA stream");
  return static_cast<CUstream>(stream);
}

// ---- contexts, modules, functions -------------------------------------------------------------
// torch works in each device's primary context; we make it current on this thread before launching.
void use_primary_context(int device) {
  static std::mutex mu;
  static std::map<int, CUcontext> contexts;
  const CudaDriver& d = driver();
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = contexts.find(device);
    if (it == contexts.end()) {
      CUdevice dev = 0;
      check_cuda(d.cuDeviceGet(&dev, device), "cuDeviceGet");
      check_cuda(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      contexts.emplace(device, ctx);
    } else {
      ctx = it->second;
    }
  }
  CUcontext current = nullptr;
  check_cuda(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != ctx) {
    check_cuda(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FA_CHECK(in.good(), "cannot read kernel image ", path, " (reinstall fa-attn)");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  data.push_back('\0');  // PTX is loaded as a NUL-terminated string; a cubin ignores the extra byte
  return data;
}

// Loading a module (and, with lazy loading, resolving its functions) is not something a CUDA graph
// capture may see: a launch on a capturing stream whose kernels are not loaded yet is refused instead
// (the runtime loads a unit's modules at its first eager call: fa_attn/runtime/preload.py).
bool capturing(CUstream stream) {
  int status = kStreamCaptureStatusNone;
  check_cuda(driver().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  return status != kStreamCaptureStatusNone;
}

void refuse_load_in_capture(const std::string& what) {
  fail("the first launch of ", what, " in this process is inside CUDA graph capture, which must not load ",
       "kernels; run the call once eagerly before capturing (torch's warm-up step does)");
}

// Loaded modules live for the process (one per device and file), like torch's own kernels.
CUmodule module_for(int device, const std::string& path, CUstream stream) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, CUmodule> modules;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(device, path);
  auto it = modules.find(key);
  if (it != modules.end()) {
    return it->second;
  }
  if (capturing(stream)) refuse_load_in_capture(path);
  const std::string image = read_file(path);
  char log[4096] = {0};
  int options[] = {kJitErrorLogBuffer, kJitErrorLogBufferSizeBytes};
  void* values[] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(log)))};
  CUmodule module = nullptr;
  const CUresult result = driver().cuModuleLoadDataEx(&module, image.data(), 2, options, values);
  FA_CHECK(result == 0, "loading ", path, " failed: ", error_text(result),
           log[0] ? std::string("; JIT log: ") + log : std::string(),
           " (a PTX image needs a driver at least as new as the toolkit that built it)");
  modules.emplace(key, module);
  return module;
}

// The decision (fa_attn/runtime/decision.py) chose this kernel because the manifest's static + dynamic shared
// memory fits the GPU's opt-in limit per block; for PTX the static part is a margin, since the driver's
// JIT decides it. Here the loaded function says its own: a kernel that would not launch is refused
// with both numbers rather than CUDA's "invalid argument".
void check_shared_memory(CUfunction fn, const std::string& name, int dynamic_bytes) {
  const CudaDriver& d = driver();
  int static_bytes = 0, optin = 0;
  CUdevice device = 0;
  check_cuda(d.cuFuncGetAttribute(&static_bytes, kFuncAttributeSharedSizeBytes, fn),
             "cuFuncGetAttribute(" + name + ", static smem)");
  check_cuda(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
  check_cuda(d.cuDeviceGetAttribute(&optin, kDeviceAttributeMaxSharedMemoryPerBlockOptin, device),
             "cuDeviceGetAttribute(max shared memory per block opt-in)");
  FA_CHECK(static_bytes + dynamic_bytes <= optin, name, " needs ", static_bytes + dynamic_bytes,
           " bytes of shared memory per block (", static_bytes, " static + ", dynamic_bytes,
           " dynamic); this GPU offers ", optin,
           ". The wheel's manifest said it fits: please report it with `fa doctor`'s output");
}

CUfunction function_for(CUmodule module, const std::string& name, int smem_bytes, CUstream stream) {
  static std::mutex mu;
  static std::map<std::pair<CUmodule, std::string>, CUfunction> functions;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(module, name);
  auto it = functions.find(key);
  if (it != functions.end()) {
    return it->second;
  }
  if (capturing(stream)) refuse_load_in_capture(name);
  const CudaDriver& d = driver();
  CUfunction fn = nullptr;
  check_cuda(d.cuModuleGetFunction(&fn, module, name.c_str()), "cuModuleGetFunction(" + name + ")");
  check_shared_memory(fn, name, smem_bytes);
  if (smem_bytes > kDefaultSmemLimit) {
    check_cuda(d.cuFuncSetAttribute(fn, kFuncAttributeMaxDynamicSharedSizeBytes, smem_bytes),
               "cuFuncSetAttribute(" + name + ", max dynamic smem " + std::to_string(smem_bytes) + ")");
  }
  functions.emplace(key, fn);
  return fn;
}

// ---- checks and FaParams --------------------------------------------------------------------------
void check_input(const char* name, const View& t, const View& q, int64_t dims) {
  FA_CHECK(t.cuda, name, " must be a CUDA tensor");
  FA_CHECK(t.device == q.device, name, " is on ", device_name(t), ", q on ", device_name(q));
  FA_CHECK(t.dtype == q.dtype, name, " dtype differs from q's");
  FA_CHECK(t.dim() == dims, name, " must have ", dims, " dims");
  FA_CHECK(t.stride(-1) == 1, name, "'s last dim must be contiguous");
  // The kernels load 16-byte vectors per row (fwd.cu): every row start must be 16-byte aligned. A
  // size-1 dim's stride is only ever multiplied by index 0, and torch leaves it arbitrary (a contiguous
  // (b, s, 1, d) can have head stride 1, and .contiguous() keeps it), so it is not checked.
  for (int64_t i = 0; i < t.dim() - 1; ++i) {
    FA_CHECK(t.size(i) == 1 || t.stride(i) % 8 == 0, name, "'s strides must be multiples of 8 elements");
  }
}

// Row/head/batch strides of a (batch, seq, heads, dim) or packed (total, heads, dim) tensor; batch
// strides are unused (0) when packed.
struct Strides {
  int64_t batch, row, head;
};

Strides strides_of(const View& t, bool packed) {
  return packed ? Strides{0, t.stride(0), t.stride(1)} : Strides{t.stride(0), t.stride(1), t.stride(2)};
}

void set_strides(const View& t, bool packed, fa_i64& batch, fa_i64& row, fa_i64& head) {
  const Strides s = strides_of(t, packed);
  std::tie(batch, row, head) = std::make_tuple(s.batch, s.row, s.head);
}

const fa_i32* index_data(const View* t) { return t != nullptr ? static_cast<const fa_i32*>(t->data) : nullptr; }

FaParams input_params(const Shape& s, const View& q, const View& k, const View& v, const View* cu_q,
                      const View* cu_k, const KvLayout& kv, const Options& o) {
  FaParams p;
  std::memset(&p, 0, sizeof(p));
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  if (s.varlen) {
    p.cu_seqlens_q = static_cast<const fa_i32*>(cu_q->data);
    p.cu_seqlens_k = static_cast<const fa_i32*>(cu_k->data);
  }
  p.seqused_k = index_data(kv.seqused_k);
  p.leftpad_k = index_data(kv.leftpad_k);
  p.kv_batch_idx = index_data(kv.kv_batch_idx);
  p.block_table = index_data(kv.block_table);
  if (kv.block_table != nullptr) {
    p.block_table_batch_stride = kv.block_table->stride(0);
    p.page_block_size = static_cast<fa_i32>(s.page_block_size);
  }
  // Paged k/v are (pages, page_block_size, heads_k, dim) whether q is packed or not: the batch
  // strides step from page to page.
  const bool packed_kv = s.varlen && kv.block_table == nullptr;
  set_strides(q, s.varlen, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  set_strides(k, packed_kv, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  set_strides(v, packed_kv, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  p.batch = static_cast<fa_i32>(s.batch);
  p.heads = static_cast<fa_i32>(s.heads);
  p.heads_k = static_cast<fa_i32>(s.heads_k);
  p.head_dim = static_cast<fa_i32>(s.head_dim);
  p.seqlen_q = static_cast<fa_i32>(s.seqlen_q);
  p.seqlen_k = static_cast<fa_i32>(s.seqlen_k);
  p.seqlen_q_rounded = static_cast<fa_i32>(round_up(s.seqlen_q, kSeqRound));
  p.seqlen_k_rounded = static_cast<fa_i32>(round_up(s.seqlen_k, kSeqRound));
  p.is_causal = o.causal ? 1 : 0;
  p.window_left = static_cast<fa_i32>(o.window_left);
  p.window_right = o.causal ? 0 : static_cast<fa_i32>(o.window_right);
  // Passed as the user gave them; the kernels fold them (fwd.cu, "Softcap").
  p.scale_softmax = static_cast<float>(o.softmax_scale);
  p.scale_softmax_log2 = static_cast<float>(o.softmax_scale * kLog2e);
  p.softcap = static_cast<float>(o.softcap);
  return p;
}

// A (batch,) int32 index tensor of the KV-cache layout (or the 2-D block_table): on q's device, rows
// contiguous.
void check_index(const char* name, const View& t, const View& q, const Shape& s, int64_t dims) {
  FA_CHECK(t.cuda && t.device == q.device, name, " must be on q's device (", device_name(q), "), got ",
           device_name(t));
  FA_CHECK(t.dtype == DType::kInt32, name, " must be int32, got ", dtype_name(t.dtype));
  FA_CHECK(t.dim() == dims && t.size(0) == s.batch, name, " must be (batch", dims == 2 ? ", pages)" : ")",
           " with batch ", s.batch);
  FA_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name, "'s last dim must be contiguous");
}

// The KV-cache layout against the shapes (Shape's page_block_size, and seqlen_k of a paged call).
void check_kv_layout(const KvLayout& kv, const View& q, const View& k, Shape& s) {
  if (kv.seqused_k != nullptr) check_index("seqused_k", *kv.seqused_k, q, s, 1);
  if (kv.leftpad_k != nullptr) check_index("leftpad_k", *kv.leftpad_k, q, s, 1);
  if (kv.kv_batch_idx != nullptr) {
    check_index("kv_batch_idx", *kv.kv_batch_idx, q, s, 1);
    FA_CHECK(!s.varlen, "kv_batch_idx needs padded k/v (packed k/v have no batch rows to pick)");
  }
  if (kv.block_table == nullptr) return;
  check_index("block_table", *kv.block_table, q, s, 2);
  FA_CHECK(kv.leftpad_k == nullptr && kv.kv_batch_idx == nullptr,
           "block_table: a paged k/v takes neither leftpad_k nor kv_batch_idx");
  s.page_block_size = k.size(1);
  FA_CHECK(s.page_block_size > 0, "block_table: k's pages (dim 1) hold no key");
  const int64_t capacity = kv.block_table->size(1) * s.page_block_size;
  FA_CHECK(s.seqlen_k >= 0 && s.seqlen_k <= capacity, "max_seqlen_k ", s.seqlen_k, " is more keys than the ",
           kv.block_table->size(1), " pages of ", s.page_block_size, " per sequence hold");
}

// Rows of the backward's workspaces: varlen pads every sequence by up to 128 rows.
int64_t workspace_rows(const Shape& s) {
  return s.varlen ? s.total_q + kSeqRound * s.batch : round_up(s.seqlen_q, kSeqRound);
}


// ---- the sm_90a forward's tensor maps -----------------------------------------------------------

constexpr const char* kHopperEntry = "fa_fwd_sm90a";  // tiles.py HOPPER_ENTRY

// Q's, K's and V's CUtensorMap for one launch of hopper_fwd.cu (tensor_maps.h), encoded by the driver.
std::vector<CUtensorMap> hopper_tensor_maps(const FaParams& p, const Launch& launch, const Entry& e,
                                            const fa_tensor_maps::Source* tma) {
  FA_CHECK(tma != nullptr, "the sm_90a unit ", launch.module, " serves the forward only (fa_attn's routing sends ",
           "split-KV and the backward to the sm_90 units)");
  fa_tensor_maps::Maps maps{};
  const fa_tensor_maps::Status status = fa_tensor_maps::hopper_maps(
      p, *tma, static_cast<int>(launch.head_dim_bucket), e.block_m, e.block_n, &maps);
  FA_CHECK(status == fa_tensor_maps::Status::kOk, "the sm_90a unit ", launch.module, " cannot take this call: ",
           fa_tensor_maps::status_text(status));
  const auto encode = driver().cuTensorMapEncodeTiled;
  FA_CHECK(encode != nullptr, "the CUDA driver (", dynlib::kCudaDriver, ") lacks cuTensorMapEncodeTiled, which ",
           "the sm_90a units need; update the NVIDIA driver (CUDA 12.0 or newer)");
  std::vector<CUtensorMap> out(3);
  const fa_tensor_maps::Encode* in[3] = {&maps.q, &maps.k, &maps.v};
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const fa_tensor_maps::Encode& m = *in[i];
    check_cuda(encode(&out[i], m.data_type, m.rank, const_cast<void*>(m.global_address), m.global_dim,
                      m.global_strides, m.box_dim, m.element_strides, m.interleave, m.swizzle, m.l2_promotion,
                      m.oob_fill),
               std::string("cuTensorMapEncodeTiled for ") + names[i] + " of " + launch.module);
  }
  return out;
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kHalf:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat:
      return "float32";
    case DType::kInt32:
      return "int32";
    default:
      return "another dtype";
  }
}

Launch parse_launch(const KernelArgs& kernel, const Shape& shape) {
  std::vector<std::string> names;
  std::stringstream stream{std::string(kernel.entries)};
  for (std::string name; std::getline(stream, name, ',');) {
    names.push_back(name);
  }
  FA_CHECK(!names.empty() && kernel.launch_size == 1 + kLaunchInts * names.size(),
           "launch data does not match the entries '", kernel.entries, "' (reinstall fa-attn)");
  Launch out{std::string(kernel.module), kernel.launch[0], {}};
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t* x = kernel.launch + 1 + kLaunchInts * i;
    out.entries.push_back(Entry{names[i], static_cast<int>(x[0]), static_cast<int>(x[1]),
                                static_cast<int>(x[2]), static_cast<int>(x[3]), static_cast<int>(x[4])});
  }
  FA_CHECK(shape.head_dim <= out.head_dim_bucket, "head dim ", shape.head_dim, " exceeds the kernel's ",
           out.head_dim_bucket);
  for (const Entry& e : out.entries) {
    FA_CHECK(shape.page_block_size == 0 || e.block_n == 0 || shape.page_block_size % e.block_n == 0,
             "block_table: pages of ", shape.page_block_size, " keys do not hold whole key blocks of ", e.block_n,
             " (", e.name, "); use a page_block_size that is a multiple of ", e.block_n);
  }
  return out;
}

bool row_aligned(const View& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

Shape check_shapes(const View& q, const View& k, const View& v, const View* cu_q, const View* cu_k,
                   const KvLayout& kv, const Options& o) {
  const bool varlen = cu_q != nullptr;
  const bool paged = kv.block_table != nullptr;
  FA_CHECK(varlen == (cu_k != nullptr), "pass both cu_seqlens_q and cu_seqlens_k, or neither");
  FA_CHECK(q.dtype == DType::kHalf || q.dtype == DType::kBFloat16, "the kernels take fp16 or bf16, got ",
           dtype_name(q.dtype));
  const int64_t dims = varlen ? 3 : 4;
  check_input("q", q, q, dims);
  check_input("k", k, q, paged ? 4 : dims);
  check_input("v", v, q, paged ? 4 : dims);
  FA_CHECK(k.sizes == v.sizes, "k and v shapes differ");
  Shape s{};
  s.varlen = varlen;
  s.heads = q.size(-2);
  s.heads_k = k.size(-2);
  s.head_dim = q.size(-1);
  FA_CHECK(k.size(-1) == s.head_dim, "q and k head dims differ");
  FA_CHECK(s.head_dim % 8 == 0 && s.head_dim > 0, "head dim must be a positive multiple of 8");
  FA_CHECK(s.heads_k > 0 && s.heads % s.heads_k == 0, "heads_k must divide heads");
  if (varlen) {
    for (const View* cu : {cu_q, cu_k}) {
      FA_CHECK(cu->cuda && cu->device == q.device && cu->dtype == DType::kInt32 && cu->dim() == 1 &&
                   cu->contiguous,
               "cu_seqlens must be contiguous int32 on q's device");
    }
    FA_CHECK(cu_q->size(0) == cu_k->size(0) && cu_q->size(0) >= 1, "cu_seqlens lengths differ");
    s.batch = cu_q->size(0) - 1;
    s.seqlen_q = o.max_seqlen_q;
    s.seqlen_k = o.max_seqlen_k;
    s.total_q = q.size(0);
    s.total_k = paged ? 0 : k.size(0);
  } else {
    s.batch = q.size(0);
    FA_CHECK(paged || kv.kv_batch_idx != nullptr || k.size(0) == s.batch,
             "q and k batch sizes differ (kv_batch_idx picks k/v rows for a cache of another batch)");
    s.seqlen_q = q.size(1);
    s.seqlen_k = paged ? o.max_seqlen_k : k.size(1);
    s.total_q = s.batch * s.seqlen_q;
    s.total_k = s.batch * s.seqlen_k;
  }
  check_kv_layout(kv, q, k, s);
  return s;
}

void check_backward_inputs(const View& dout, const View& out, const View& q) {
  check_input("dout", dout, q, q.dim());
  check_input("out", out, q, q.dim());
  FA_CHECK(dout.sizes == q.sizes && out.sizes == q.sizes, "dout/out must have q's shape");
}

void check_lse(const View& lse, const View& q, const Shape& shape) {
  FA_CHECK(lse.cuda && lse.device == q.device, "softmax_lse is on ", device_name(lse), ", q on ", device_name(q),
           "; pass the LSE the forward returned for these tensors");
  FA_CHECK(lse.dtype == DType::kFloat && lse.contiguous && lse.sizes == lse_sizes(shape, lse_rows(shape)),
           "softmax_lse must be the contiguous fp32 LSE of the forward");
}

std::vector<int64_t> lse_sizes(const Shape& s, int64_t seqlen) {
  return s.varlen ? std::vector<int64_t>{s.heads, seqlen} : std::vector<int64_t>{s.batch, s.heads, seqlen};
}

int64_t lse_rows(const Shape& s) { return s.varlen ? s.total_q : s.seqlen_q; }

std::vector<int64_t> dq_accum_sizes(const Shape& s, const Launch& launch) {
  // fa_bwd_preprocess zeroes the dq_accum rows each block owns before fa_bwd adds into them (bwd.cu),
  // so the forms allocate it without a memset.
  const int64_t rows = workspace_rows(s);
  return s.varlen ? std::vector<int64_t>{rows, s.heads, launch.head_dim_bucket}
                  : std::vector<int64_t>{s.batch, rows, s.heads, launch.head_dim_bucket};
}

std::vector<int64_t> dsoftmax_sum_sizes(const Shape& s) { return lse_sizes(s, workspace_rows(s)); }

std::vector<int64_t> per_query_head_sizes(const View& k, const Shape& s) {
  std::vector<int64_t> sizes = k.sizes;
  sizes[sizes.size() - 2] = s.heads;
  return sizes;
}

std::vector<int64_t> grouped_sizes(const View& k, const Shape& s) {
  std::vector<int64_t> split = k.sizes;
  split.back() = s.heads / s.heads_k;  // (..., heads_k, group, dim)
  split.push_back(s.head_dim);
  return split;
}

int64_t group_dim(const View& k) { return k.dim() - 1; }

FaParams forward_params(const Shape& s, const View& q, const View& k, const View& v, const View* cu_q,
                        const View* cu_k, const KvLayout& kv, const Options& o, const View& out, const View& lse) {
  FaParams p = input_params(s, q, k, v, cu_q, cu_k, kv, o);
  p.o = out.data;
  p.lse = static_cast<float*>(lse.data);
  set_strides(out, s.varlen, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  return p;
}

std::vector<int64_t> split_accum_sizes(const Shape& s, int64_t num_splits, int64_t head_dim_bucket) {
  std::vector<int64_t> sizes{num_splits};
  const std::vector<int64_t> lse = lse_sizes(s, lse_rows(s));
  sizes.insert(sizes.end(), lse.begin(), lse.end());
  if (head_dim_bucket > 0) sizes.push_back(head_dim_bucket);
  return sizes;
}

FaParams split_kv_params(const Shape& s, const View& q, const View& k, const View& v, const View* cu_q,
                         const View* cu_k, const KvLayout& kv, const Options& o, const View& out, const View& lse,
                         int64_t num_splits, const View& o_accum, const View& lse_accum) {
  FA_CHECK(num_splits >= 1, "num_splits must be >= 1, got ", num_splits);
  FaParams p = forward_params(s, q, k, v, cu_q, cu_k, kv, o, out, lse);
  p.num_splits = static_cast<fa_i32>(num_splits);
  p.o_accum = static_cast<float*>(o_accum.data);
  p.lse_accum = static_cast<float*>(lse_accum.data);
  return p;
}

FaParams backward_params(const Shape& s, const View& q, const View& k, const View& v, const View* cu_q,
                         const View* cu_k, const Options& o, const View& dout, const View& out,
                         const View& lse, const BackwardOutputs& w) {
  FaParams p = input_params(s, q, k, v, cu_q, cu_k, KvLayout{}, o);
  p.o = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.dout = dout.data;
  p.dq = w.dq.data;
  p.dk = w.dk.data;
  p.dv = w.dv.data;
  p.dq_accum = static_cast<float*>(w.dq_accum.data);
  p.dsoftmax_sum = static_cast<float*>(w.dsoftmax_sum.data);
  const bool packed = s.varlen;
  set_strides(out, packed, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  set_strides(dout, packed, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  set_strides(w.dq, packed, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  set_strides(w.dk, packed, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  set_strides(w.dv, packed, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  return p;
}

PairGrid fold_batch_heads(int64_t batch, int64_t heads, int64_t limit) {
  PairGrid pairs{0, 0};
  const fa_geometry::Status status = fa_geometry::fold_batch_heads(batch, heads, limit, &pairs);
  FA_CHECK(status != fa_geometry::Status::kBadPairs, "fold_batch_heads: batch ", batch, ", heads ", heads);
  FA_CHECK(status == fa_geometry::Status::kOk, "batch ", batch, " x heads ", heads, " = ", batch * heads,
           " (batch, head) pairs exceed the ", limit, " x ", limit,
           " blocks a grid's y and z dimensions hold; split the batch");
  return pairs;
}

fa_tensor_maps::Source tma_source(const View& q, const View& k) {
  // padded (batch, seqlen, heads, dim); packed (total, heads, dim) with a batch of 1
  const bool q_packed = q.dim() == 3, k_packed = k.dim() == 3;
  return fa_tensor_maps::Source{q.dtype == DType::kBFloat16, q.size(q_packed ? 0 : 1), q_packed ? 1 : q.size(0),
                                k.size(k_packed ? 0 : 1), k_packed ? 1 : k.size(0)};
}

void launch_all(const FaParams& params, const Launch& launch, int device, const fa_tensor_maps::Source* tma) {
  use_primary_context(device);
  CUstream stream = current_stream(device);
  // The module and every entry's function first, whether or not a grid is empty: so a call with no
  // (batch, head) pair (batch 0) loads a unit's kernels and launches nothing (fa_attn/runtime/preload.py).
  CUmodule module = module_for(device, launch.module, stream);
  std::vector<CUfunction> functions;
  for (const Entry& e : launch.entries) functions.push_back(function_for(module, e.name, e.smem_bytes, stream));
  for (size_t i = 0; i < launch.entries.size(); ++i) {
    const Entry& e = launch.entries[i];
    fa_geometry::Launch geo{};
    const fa_geometry::Status status = fa_geometry::entry_launch(e.threads, e.block_m, e.block_n, e.smem_bytes,
                                                                 e.grid, params, kGridYZLimit, &geo);
    FA_CHECK(status != fa_geometry::Status::kNoBlockSize, "entry ", e.name, " has no block size (reinstall fa-attn)");
    if (status == fa_geometry::Status::kEmpty) {
      continue;  // nothing to do (empty sequence); a zero grid is a launch error
    }
    if (status != fa_geometry::Status::kOk) fold_batch_heads(params.batch, params.heads);  // its error
    CUfunction fn = functions[i];
    FaParams copy = params;  // cuLaunchKernel copies the argument bytes; keep a mutable lvalue
    std::vector<CUtensorMap> maps;  // the sm_90a forward's Q, K, V maps, after the params
    if (e.name == kHopperEntry) maps = hopper_tensor_maps(params, launch, e, tma);
    void* args[] = {&copy, maps.data(), maps.data() + 1, maps.data() + 2};
    check_cuda(driver().cuLaunchKernel(fn, geo.grid_x, geo.grid_y, geo.grid_z, geo.threads, 1, 1,
                                       static_cast<unsigned>(geo.smem_bytes), stream, args, nullptr),
               "launching " + e.name);
  }
}

}  // namespace fa_binding
