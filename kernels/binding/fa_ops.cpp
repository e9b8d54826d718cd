// CUDA kernels of the fa_attn::fwd / fa_attn::bwd operators (schemas: kernels/fa_attn/ops.py).
//
// The binding only launches: Python (fa_attn/dispatch.py) has already chosen the cubin/PTX file and
// passes it with the launch numbers from the wheel manifest. Here we check what a kernel would
// otherwise read out of bounds, fill FaParams (strides in elements), allocate outputs and workspaces
// with at:: calls, and launch on torch's current stream through the driver API.
//
// No CUDA header, no libtorch_cuda/libc10_cuda at link time (see cuda_driver.h): the same file loads
// into a CPU-only torch, where it registers the kernels and is never called. No Python C API either,
// so one binary serves every Python version of its torch minor.
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "cuda_driver.h"
#include "params.h"

namespace fa_binding {
namespace {

constexpr double kLog2e = 1.4426950408889634;  // log2(e)
constexpr int64_t kSeqRound = 128;  // seqlen rounding of lse-shaped workspaces (params.h)
constexpr int kLaunchInts = 5;      // per entry: threads, block_m, block_n, smem_bytes, grid
constexpr int kGridKBlocks = 1;     // grid code 0: "q_blocks", 1: "k_blocks" (ops.py GRID_CODES)
constexpr int kGridQBlocksSplits = 2;  // 2: "q_blocks_splits", q blocks times params.num_splits
constexpr int kDefaultSmemLimit = 48 * 1024;  // above this a kernel must opt in (cuFuncSetAttribute)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void check_cuda(CUresult result, const std::string& what) {
  TORCH_CHECK(result == 0, "fa_attn: ", what, " failed: ", error_text(result));
}

// ---- torch's current stream -------------------------------------------------------------------
// torch's C shim (torch/csrc/inductor/aoti_torch/c/shim.h, since 2.4) exports this extern "C"
// function from libtorch_cuda.so, which `import torch` has already loaded; resolving it at run time
// keeps libtorch_cuda out of our DT_NEEDED list.
using GetStreamFn = int32_t (*)(int32_t device_index, void** ret_stream);

GetStreamFn stream_getter() {
  static const GetStreamFn fn = [] {
    void* sym = nullptr;
    if (void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD)) {
      sym = dlsym(lib, "aoti_torch_get_current_cuda_stream");
    }
    if (sym == nullptr) {
      sym = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    }
    return reinterpret_cast<GetStreamFn>(sym);
  }();
  TORCH_CHECK(fn != nullptr, "fa_attn: torch's aoti_torch_get_current_cuda_stream was not found; "
              "this torch build has no CUDA support (install a CUDA build of torch)");
  return fn;
}

CUstream current_stream(int device) {
  void* stream = nullptr;
  TORCH_CHECK(stream_getter()(device, &stream) == 0, "fa_attn: could not get torch's current CUDA stream");
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
  TORCH_CHECK(in.good(), "fa_attn: cannot read kernel image ", path, " (reinstall fa-attn)");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  data.push_back('\0');  // PTX is loaded as a NUL-terminated string; a cubin ignores the extra byte
  return data;
}

// Loaded modules live for the process (one per device and file), like torch's own kernels.
CUmodule module_for(int device, const std::string& path) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, CUmodule> modules;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(device, path);
  auto it = modules.find(key);
  if (it != modules.end()) {
    return it->second;
  }
  const std::string image = read_file(path);
  char log[4096] = {0};
  int options[] = {kJitErrorLogBuffer, kJitErrorLogBufferSizeBytes};
  void* values[] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(log)))};
  CUmodule module = nullptr;
  const CUresult result = driver().cuModuleLoadDataEx(&module, image.data(), 2, options, values);
  TORCH_CHECK(result == 0, "fa_attn: loading ", path, " failed: ", error_text(result),
              log[0] ? std::string("; JIT log: ") + log : std::string(),
              " (a PTX image needs a driver at least as new as the toolkit that built it)");
  modules.emplace(key, module);
  return module;
}

CUfunction function_for(CUmodule module, const std::string& name, int smem_bytes) {
  static std::mutex mu;
  static std::map<std::pair<CUmodule, std::string>, CUfunction> functions;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(module, name);
  auto it = functions.find(key);
  if (it != functions.end()) {
    return it->second;
  }
  const CudaDriver& d = driver();
  CUfunction fn = nullptr;
  check_cuda(d.cuModuleGetFunction(&fn, module, name.c_str()), "cuModuleGetFunction(" + name + ")");
  if (smem_bytes > kDefaultSmemLimit) {
    check_cuda(d.cuFuncSetAttribute(fn, kFuncAttributeMaxDynamicSharedSizeBytes, smem_bytes),
               "cuFuncSetAttribute(" + name + ", max dynamic smem " + std::to_string(smem_bytes) + ")");
  }
  functions.emplace(key, fn);
  return fn;
}

// ---- launch data from Python ------------------------------------------------------------------
struct Entry {
  std::string name;
  int threads, block_m, block_n, smem_bytes, grid;
};

struct Launch {
  int64_t head_dim_bucket;
  std::vector<Entry> entries;  // in launch order
};

Launch parse_launch(const std::string& entries, at::IntArrayRef launch) {
  std::vector<std::string> names;
  std::stringstream stream(entries);
  for (std::string name; std::getline(stream, name, ',');) {
    names.push_back(name);
  }
  TORCH_CHECK(!names.empty() && launch.size() == 1 + kLaunchInts * names.size(),
              "fa_attn: launch data does not match the entries '", entries, "' (reinstall fa-attn)");
  Launch out{launch[0], {}};
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t* x = launch.data() + 1 + kLaunchInts * i;
    out.entries.push_back(Entry{names[i], static_cast<int>(x[0]), static_cast<int>(x[1]),
                                static_cast<int>(x[2]), static_cast<int>(x[3]), static_cast<int>(x[4])});
  }
  return out;
}

void launch_all(const FaParams& params, const std::string& module_path, const Launch& launch, int device) {
  use_primary_context(device);
  CUmodule module = module_for(device, module_path);
  CUstream stream = current_stream(device);
  for (const Entry& e : launch.entries) {
    const bool by_keys = e.grid == kGridKBlocks;
    const int64_t rows = by_keys ? params.seqlen_k : params.seqlen_q;
    const int64_t block = by_keys ? e.block_n : e.block_m;
    TORCH_CHECK(block > 0 && e.threads > 0, "fa_attn: entry ", e.name, " has no block size (reinstall fa-attn)");
    const int64_t splits = e.grid == kGridQBlocksSplits ? params.num_splits : 1;
    const unsigned grid_x = static_cast<unsigned>((rows + block - 1) / block * splits);
    if (grid_x == 0 || params.batch == 0 || params.heads == 0) {
      continue;  // nothing to do (empty sequence); a zero grid is a launch error
    }
    CUfunction fn = function_for(module, e.name, e.smem_bytes);
    FaParams copy = params;  // cuLaunchKernel copies the argument bytes; keep a mutable lvalue
    void* args[] = {&copy};
    check_cuda(driver().cuLaunchKernel(fn, grid_x, static_cast<unsigned>(params.batch),
                                       static_cast<unsigned>(params.heads), e.threads, 1, 1, e.smem_bytes,
                                       stream, args, nullptr),
               "launching " + e.name);
  }
}

// ---- input checks and FaParams ------------------------------------------------------------------
void check_input(const char* name, const at::Tensor& t, const at::Tensor& q, int64_t dims) {
  TORCH_CHECK(t.is_cuda(), "fa_attn: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.device() == q.device(), "fa_attn: ", name, " is on ", t.device(), ", q on ", q.device());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "fa_attn: ", name, " dtype differs from q's");
  TORCH_CHECK(t.dim() == dims, "fa_attn: ", name, " must have ", dims, " dims");
  TORCH_CHECK(t.stride(-1) == 1, "fa_attn: ", name, "'s last dim must be contiguous");
  // The kernels load 16-byte vectors per row (fwd.cu): every row start must be 16-byte aligned. A
  // size-1 dim's stride is only ever multiplied by index 0, and torch leaves it arbitrary (a contiguous
  // (b, s, 1, d) can have head stride 1, and .contiguous() keeps it), so it is not checked.
  for (int64_t i = 0; i < t.dim() - 1; ++i) {
    TORCH_CHECK(t.size(i) == 1 || t.stride(i) % 8 == 0, "fa_attn: ", name,
                "'s strides must be multiples of 8 elements");
  }
}

// A view that starts mid-row (e.g. x[:, 1:] of a packed buffer) can be misaligned even with good
// strides; copying it is cheaper than a kernel variant for it (Python cannot check this under
// torch.compile, see fa_attn/interface.py).
at::Tensor row_aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone(at::MemoryFormat::Contiguous);
}

// Row/head/batch strides of a (batch, seq, heads, dim) or packed (total, heads, dim) tensor; batch
// strides are unused (0) when packed.
struct Strides {
  int64_t batch, row, head;
};
Strides strides_of(const at::Tensor& t, bool packed) {
  return packed ? Strides{0, t.stride(0), t.stride(1)} : Strides{t.stride(0), t.stride(1), t.stride(2)};
}

struct Shape {
  bool varlen;
  int64_t batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, total_q, total_k;
};

Shape check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k,
                   int64_t max_seqlen_q, int64_t max_seqlen_k) {
  const bool varlen = cu_q.has_value();
  TORCH_CHECK(varlen == cu_k.has_value(), "fa_attn: pass both cu_seqlens_q and cu_seqlens_k, or neither");
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "fa_attn: the kernels take fp16 or bf16, got ", q.scalar_type());
  const int64_t dims = varlen ? 3 : 4;
  check_input("q", q, q, dims);
  check_input("k", k, q, dims);
  check_input("v", v, q, dims);
  TORCH_CHECK(k.sizes() == v.sizes(), "fa_attn: k and v shapes differ");
  Shape s{};
  s.varlen = varlen;
  s.heads = q.size(-2);
  s.heads_k = k.size(-2);
  s.head_dim = q.size(-1);
  TORCH_CHECK(k.size(-1) == s.head_dim, "fa_attn: q and k head dims differ");
  TORCH_CHECK(s.head_dim % 8 == 0 && s.head_dim > 0, "fa_attn: head dim must be a positive multiple of 8");
  TORCH_CHECK(s.heads_k > 0 && s.heads % s.heads_k == 0, "fa_attn: heads_k must divide heads");
  if (varlen) {
    for (const at::Tensor* cu : {&*cu_q, &*cu_k}) {
      TORCH_CHECK(cu->is_cuda() && cu->device() == q.device() && cu->scalar_type() == at::kInt &&
                  cu->dim() == 1 && cu->is_contiguous(), "fa_attn: cu_seqlens must be contiguous int32 on q's device");
    }
    TORCH_CHECK(cu_q->numel() == cu_k->numel() && cu_q->numel() >= 1, "fa_attn: cu_seqlens lengths differ");
    s.batch = cu_q->numel() - 1;
    s.seqlen_q = max_seqlen_q;
    s.seqlen_k = max_seqlen_k;
    s.total_q = q.size(0);
    s.total_k = k.size(0);
  } else {
    s.batch = q.size(0);
    TORCH_CHECK(k.size(0) == s.batch, "fa_attn: q and k batch sizes differ");
    s.seqlen_q = q.size(1);
    s.seqlen_k = k.size(1);
    s.total_q = s.batch * s.seqlen_q;
    s.total_k = s.batch * s.seqlen_k;
  }
  return s;
}

FaParams base_params(const Shape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k,
                     double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                     double softcap) {
  FaParams p;
  std::memset(&p, 0, sizeof(p));
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  if (s.varlen) {
    p.cu_seqlens_q = cu_q->data_ptr<int32_t>();
    p.cu_seqlens_k = cu_k->data_ptr<int32_t>();
  }
  const Strides sq = strides_of(q, s.varlen), sk = strides_of(k, s.varlen), sv = strides_of(v, s.varlen);
  std::tie(p.q_batch_stride, p.q_row_stride, p.q_head_stride) = std::make_tuple(sq.batch, sq.row, sq.head);
  std::tie(p.k_batch_stride, p.k_row_stride, p.k_head_stride) = std::make_tuple(sk.batch, sk.row, sk.head);
  std::tie(p.v_batch_stride, p.v_row_stride, p.v_head_stride) = std::make_tuple(sv.batch, sv.row, sv.head);
  p.batch = static_cast<fa_i32>(s.batch);
  p.heads = static_cast<fa_i32>(s.heads);
  p.heads_k = static_cast<fa_i32>(s.heads_k);
  p.head_dim = static_cast<fa_i32>(s.head_dim);
  p.seqlen_q = static_cast<fa_i32>(s.seqlen_q);
  p.seqlen_k = static_cast<fa_i32>(s.seqlen_k);
  p.seqlen_q_rounded = static_cast<fa_i32>(round_up(s.seqlen_q, kSeqRound));
  p.seqlen_k_rounded = static_cast<fa_i32>(round_up(s.seqlen_k, kSeqRound));
  p.is_causal = causal ? 1 : 0;
  p.window_left = static_cast<fa_i32>(window_left);
  p.window_right = causal ? 0 : static_cast<fa_i32>(window_right);
  // Passed as the user gave them; the kernels fold them (fwd.cu, "Softcap").
  p.scale_softmax = static_cast<float>(softmax_scale);
  p.scale_softmax_log2 = static_cast<float>(softmax_scale * kLog2e);
  p.softcap = static_cast<float>(softcap);
  return p;
}

std::vector<int64_t> lse_sizes(const Shape& s, int64_t seqlen) {
  return s.varlen ? std::vector<int64_t>{s.heads, seqlen} : std::vector<int64_t>{s.batch, s.heads, seqlen};
}

// ---- the operators --------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor> fwd(
    const at::Tensor& q_arg, const at::Tensor& k_arg, const at::Tensor& v_arg, const std::optional<at::Tensor>& cu_q,
    const std::optional<at::Tensor>& cu_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, double softcap, c10::string_view module,
    c10::string_view entries, at::IntArrayRef launch, c10::string_view /*bwd_module*/,
    c10::string_view /*bwd_entries*/, at::IntArrayRef /*bwd_launch*/) {
  const at::Tensor q = row_aligned(q_arg), k = row_aligned(k_arg), v = row_aligned(v_arg);
  const Shape s = check_shapes(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k);
  const Launch plan = parse_launch(std::string(entries), launch);
  TORCH_CHECK(s.head_dim <= plan.head_dim_bucket, "fa_attn: head dim ", s.head_dim, " exceeds the kernel's ",
              plan.head_dim_bucket);
  c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty(lse_sizes(s, s.varlen ? s.total_q : s.seqlen_q), q.options().dtype(at::kFloat));
  FaParams p = base_params(s, q, k, v, cu_q, cu_k, softmax_scale, causal, window_left, window_right, softcap);
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  const Strides so = strides_of(out, s.varlen);
  std::tie(p.o_batch_stride, p.o_row_stride, p.o_head_stride) = std::make_tuple(so.batch, so.row, so.head);
  launch_all(p, std::string(module), plan, q.device().index());
  return {out, lse};
}

// The split-KV forward (decode): partials of num_splits shares of the keys into fp32 workspaces
// (params.h), then the LSE-weighted combine; the same outputs as fwd. Inference only (no autograd).
std::tuple<at::Tensor, at::Tensor> fwd_splitkv(
    const at::Tensor& q_arg, const at::Tensor& k_arg, const at::Tensor& v_arg, const std::optional<at::Tensor>& cu_q,
    const std::optional<at::Tensor>& cu_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, double softcap, int64_t num_splits,
    c10::string_view module, c10::string_view entries, at::IntArrayRef launch) {
  const at::Tensor q = row_aligned(q_arg), k = row_aligned(k_arg), v = row_aligned(v_arg);
  const Shape s = check_shapes(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k);
  const Launch plan = parse_launch(std::string(entries), launch);
  TORCH_CHECK(s.head_dim <= plan.head_dim_bucket, "fa_attn: head dim ", s.head_dim, " exceeds the kernel's ",
              plan.head_dim_bucket);
  TORCH_CHECK(num_splits >= 1, "fa_attn: num_splits must be >= 1, got ", num_splits);
  c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  const std::vector<int64_t> lse_shape = lse_sizes(s, s.varlen ? s.total_q : s.seqlen_q);
  at::Tensor lse = at::empty(lse_shape, q.options().dtype(at::kFloat));
  std::vector<int64_t> accum_shape{num_splits};
  accum_shape.insert(accum_shape.end(), lse_shape.begin(), lse_shape.end());
  at::Tensor lse_accum = at::empty(accum_shape, q.options().dtype(at::kFloat));
  accum_shape.push_back(plan.head_dim_bucket);
  at::Tensor o_accum = at::empty(accum_shape, q.options().dtype(at::kFloat));
  FaParams p = base_params(s, q, k, v, cu_q, cu_k, softmax_scale, causal, window_left, window_right, softcap);
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.o_accum = o_accum.data_ptr<float>();
  p.lse_accum = lse_accum.data_ptr<float>();
  p.num_splits = static_cast<fa_i32>(num_splits);
  const Strides so = strides_of(out, s.varlen);
  std::tie(p.o_batch_stride, p.o_row_stride, p.o_head_stride) = std::make_tuple(so.batch, so.row, so.head);
  launch_all(p, std::string(module), plan, q.device().index());
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(
    const at::Tensor& dout_arg, const at::Tensor& q_arg, const at::Tensor& k_arg, const at::Tensor& v_arg,
    const at::Tensor& out_arg,
    const at::Tensor& lse, const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, c10::string_view module, c10::string_view entries,
    at::IntArrayRef launch) {
  const at::Tensor q = row_aligned(q_arg), k = row_aligned(k_arg), v = row_aligned(v_arg);
  const at::Tensor dout = row_aligned(dout_arg), out = row_aligned(out_arg);
  const Shape s = check_shapes(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k);
  check_input("dout", dout, q, q.dim());
  check_input("out", out, q, q.dim());
  TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes(), "fa_attn: dout/out must have q's shape");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
              lse.sizes() == at::IntArrayRef(lse_sizes(s, s.varlen ? s.total_q : s.seqlen_q)),
              "fa_attn: softmax_lse must be the contiguous fp32 LSE of the forward");
  const Launch plan = parse_launch(std::string(entries), launch);
  TORCH_CHECK(s.head_dim <= plan.head_dim_bucket, "fa_attn: head dim ", s.head_dim, " exceeds the kernel's ",
              plan.head_dim_bucket);
  c10::DeviceGuard guard(q.device());
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  const int64_t sq_rounded = round_up(s.seqlen_q, kSeqRound);
  const int64_t dim_rounded = plan.head_dim_bucket;
  // Workspaces (params.h): varlen pads every sequence by up to 128 rows, hence total + 128 * batch.
  // fa_bwd_preprocess zeroes the dq_accum rows each block owns before fa_bwd adds into them (bwd.cu),
  // so no memset here.
  const int64_t ws_rows = s.varlen ? s.total_q + kSeqRound * s.batch : sq_rounded;
  at::Tensor dq_accum = s.varlen ? at::empty({ws_rows, s.heads, dim_rounded}, f32)
                                 : at::empty({s.batch, ws_rows, s.heads, dim_rounded}, f32);
  at::Tensor dsoftmax_sum = at::empty(lse_sizes(s, ws_rows), f32);
  at::Tensor dq = at::empty(q.sizes(), q.options());
  // With GQA the kernels write dk/dv per query head; the groups are summed below.
  const bool grouped = s.heads != s.heads_k;
  std::vector<int64_t> expanded(k.sizes().begin(), k.sizes().end());
  expanded[expanded.size() - 2] = s.heads;
  at::Tensor dk = grouped ? at::empty(expanded, k.options()) : at::empty(k.sizes(), k.options());
  at::Tensor dv = grouped ? at::empty(expanded, v.options()) : at::empty(v.sizes(), v.options());

  FaParams p = base_params(s, q, k, v, cu_q, cu_k, softmax_scale, causal, window_left, window_right, softcap);
  p.o = const_cast<void*>(out.data_ptr());
  p.lse = const_cast<float*>(lse.data_ptr<float>());
  p.dout = dout.data_ptr();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dq_accum = dq_accum.data_ptr<float>();
  p.dsoftmax_sum = dsoftmax_sum.data_ptr<float>();
  const bool packed = s.varlen;
  const Strides so = strides_of(out, packed), sd = strides_of(dout, packed), sdq = strides_of(dq, packed),
                sdk = strides_of(dk, packed), sdv = strides_of(dv, packed);
  std::tie(p.o_batch_stride, p.o_row_stride, p.o_head_stride) = std::make_tuple(so.batch, so.row, so.head);
  std::tie(p.do_batch_stride, p.do_row_stride, p.do_head_stride) = std::make_tuple(sd.batch, sd.row, sd.head);
  std::tie(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride) = std::make_tuple(sdq.batch, sdq.row, sdq.head);
  std::tie(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride) = std::make_tuple(sdk.batch, sdk.row, sdk.head);
  std::tie(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride) = std::make_tuple(sdv.batch, sdv.row, sdv.head);
  launch_all(p, std::string(module), plan, q.device().index());

  if (grouped) {
    const int64_t group = s.heads / s.heads_k;
    std::vector<int64_t> split(k.sizes().begin(), k.sizes().end());
    split.back() = group;  // (..., heads_k, group, dim): query head i belongs to kv head i / group
    split.push_back(s.head_dim);
    const int64_t group_dim = static_cast<int64_t>(split.size()) - 2;
    dk = dk.view(split).sum(group_dim);
    dv = dv.view(split).sum(group_dim);
  }
  return {dq, dk, dv};
}

}  // namespace
}  // namespace fa_binding

TORCH_LIBRARY_IMPL(fa_attn, CUDA, m) {
  m.impl("fwd", &fa_binding::fwd);
  m.impl("bwd", &fa_binding::bwd);
  m.impl("fwd_splitkv", &fa_binding::fwd_splitkv);
}
