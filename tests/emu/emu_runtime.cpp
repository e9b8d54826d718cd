// The emulator's runtime (see emu.h for what it checks): fibers and their scheduler, shared and global
// memory shadows, the PTX interpreter the kernels' inline asm reaches, the __tsan_* hooks that see
// the kernels' plain loads and stores, and the C interface emu_harness.py calls.
//
// Compiled once, without -fsanitize, and linked into every emulated kernel library (each library has
// its own copy: -Wl,-Bsymbolic), so none of the accesses made here reach the hooks.
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_set>
#include <unordered_map>
#include <vector>

#include "geometry.h"  // kernels/binding: the launch geometry launch.cpp uses
#include "params.h"    // FaParams, host layout (the same bytes as the device's)

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct Operand {  // emu.h's, the same layout
  char cons;
  char mode;
  uint8_t size;
  void* ptr;
  uint64_t val;
};

Dim3 cur_tid, cur_bid, cur_bdim, cur_gdim;

constexpr int kMaxSmem = 256 * 1024;
constexpr int kMaxThreads = 1024;
constexpr int kWarpSize = 32;
constexpr int kMaxOps = 144;   // asm operands of one statement (wgmma m64n256: 128 accumulators + 7)
constexpr int kMaxLocals = 4;  // .reg declarations of one statement

void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- numbers ---------------------------------------------------------------------------------------
inline float bits_f(uint32_t v) {
  float f;
  memcpy(&f, &v, 4);
  return f;
}
inline uint32_t f_bits(float f) {
  uint32_t v;
  memcpy(&v, &f, 4);
  return v;
}
inline float half_to_float(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
inline uint16_t float_to_half(float f, bool rz) {
  if (rz) {  // round toward zero: the nearest-even result if it is not larger in magnitude, else one less
    const _Float16 x = static_cast<_Float16>(f);
    if (std::isnan(f) || std::isinf(f) || std::fabs(static_cast<float>(x)) <= std::fabs(f)) {
      uint16_t h;
      memcpy(&h, &x, 2);
      return h;
    }
    uint16_t h;
    memcpy(&h, &x, 2);
    return static_cast<uint16_t>(h - 1);
  }
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  memcpy(&h, &x, 2);
  return h;
}
inline float bf16_to_float(uint16_t b) { return bits_f(static_cast<uint32_t>(b) << 16); }
inline uint16_t float_to_bf16(float f, bool rz) {
  const uint32_t u = f_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return 0x7fff;  // canonical NaN
  if (rz) return static_cast<uint16_t>(u >> 16);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x; }

// ---- PTX: the parsed form of one asm template ------------------------------------------------------
enum class Op {
  kMov,
  kCvta,
  kCvt,
  kEx2,
  kLg2,
  kRcp,
  kTanh,
  kShfl,
  kLdmatrix,
  kMma,
  kCpAsync,
  kCommit,
  kWaitGroup,
  kWaitAll,
  kLd,
  kSt,
  kRed,
  // sm_90a (hopper.cuh)
  kSetp,
  kSelp,
  kElect,
  kWgFence,
  kWgCommit,
  kWgWait,
  kWgmma,
  kMbarInit,
  kMbarArrive,
  kMbarExpectTx,
  kMbarTryWait,
  kFence,
  kBarSync,
  kBarArrive,
  kPrefetchTmap,
  kTma,
  kSetmaxnreg,
};

enum class RefKind { kNone, kOperand, kLocal, kImm };
struct Ref {
  RefKind kind = RefKind::kNone;
  int64_t v = 0;  // operand index, local index or the immediate
};

struct Arg {  // one instruction operand: a scalar, a vector {..} or an address [..]
  std::vector<Ref> regs;
  bool vec = false, addr = false;
  int64_t offset = 0;  // [reg+offset]
};

enum class Ty { kNone, kF16, kBF16, kF32, kU32, kU64, kB16, kB32 };

struct Instr {
  Op op;
  std::string text;    // the statement as written
  std::string opcode;  // its first word
  std::vector<Arg> args;
  // modifiers as parsed (only what the forms below need)
  bool ftz = false, rz = false, trans = false, nc = false, shared = false, global = false, x2pack = false;
  int count = 1;  // ldmatrix matrices, ld/st vector width
  int bytes = 4;  // ld/st element size; cp.async cp-size
  int k = 16;     // mma k
  Ty dst = Ty::kNone, src = Ty::kNone;
  char shfl_mode = 'b';  // b(fly) u(p) d(own) i(dx)
  int n = 0;             // wgmma N; cp.async.bulk.tensor rank
  bool expect_tx = false;  // mbarrier.arrive.expect_tx; setmaxnreg .inc (true) or .dec
  bool collective = false;
  bool memory = false;  // touches memory: a scheduling point
};

struct Program {
  std::vector<Instr> instrs;
  int locals = 0;
};

// Launch-wide state the interpreter needs before the scheduler's definitions.
int g_arch = 0;            // __CUDA_ARCH__ of the library (emu.h's static initializer)
bool g_arch_specific = false;  // an sm_90a library (the arch-specific features: wgmma, setmaxnreg)
bool g_tanh_exact = false;

[[noreturn]] void parse_fail(const std::string& text, const std::string& what) {
  fail("PTX '%s': %s", text.c_str(), what.c_str());
  abort();
}

inline std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split_top(const std::string& s, char sep) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    if (c == sep && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!trim(cur).empty() || !out.empty()) out.push_back(trim(cur));
  return out;
}

Ref parse_ref(const std::string& tok, const std::map<std::string, int>& locals, const std::string& text) {
  Ref r;
  if (tok == "_") return r;  // the sink: a result nobody reads
  if (tok.size() >= 2 && tok[0] == '%' && isdigit(static_cast<unsigned char>(tok[1]))) {
    r.kind = RefKind::kOperand;
    r.v = strtol(tok.c_str() + 1, nullptr, 10);
    if (r.v >= kMaxOps) parse_fail(text, "operand " + tok + " past the emulator's " + std::to_string(kMaxOps));
    return r;
  }
  auto it = locals.find(tok);
  if (it != locals.end()) {
    r.kind = RefKind::kLocal;
    r.v = it->second;
    return r;
  }
  char* end = nullptr;
  const long long imm = strtoll(tok.c_str(), &end, 0);
  if (!tok.empty() && end != nullptr && *end == '\0') {
    r.kind = RefKind::kImm;
    r.v = imm;
    return r;
  }
  parse_fail(text, "operand '" + tok + "' is neither %N, a declared register nor an integer");
}

Arg parse_arg(const std::string& s, const std::map<std::string, int>& locals, const std::string& text) {
  Arg a;
  if (s.size() >= 2 && s.front() == '{' && s.back() == '}') {
    a.vec = true;
    for (const std::string& t : split_top(s.substr(1, s.size() - 2), ',')) a.regs.push_back(parse_ref(t, locals, text));
    return a;
  }
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') {
    a.addr = true;
    std::string in = trim(s.substr(1, s.size() - 2));
    const std::vector<std::string> parts = split_top(in, ',');
    if (parts.size() == 2 && parts[1].size() >= 2 && parts[1].front() == '{') {  // [tensor-map, {coordinates}]
      a.regs.push_back(parse_ref(parts[0], locals, text));
      for (const Ref& c : parse_arg(parts[1], locals, text).regs) a.regs.push_back(c);
      a.vec = true;
      return a;
    }
    const size_t plus = in.find('+');
    if (plus != std::string::npos) {
      a.offset = strtoll(trim(in.substr(plus + 1)).c_str(), nullptr, 0);
      in = trim(in.substr(0, plus));
    }
    a.regs.push_back(parse_ref(in, locals, text));
    return a;
  }
  a.regs.push_back(parse_ref(s, locals, text));
  return a;
}

Ty parse_ty(const std::string& m) {
  if (m == "f16") return Ty::kF16;
  if (m == "bf16") return Ty::kBF16;
  if (m == "f32") return Ty::kF32;
  if (m == "u32" || m == "s32") return Ty::kU32;
  if (m == "b32") return Ty::kB32;
  if (m == "u64" || m == "s64" || m == "b64") return Ty::kU64;
  if (m == "b16" || m == "u16") return Ty::kB16;
  return Ty::kNone;
}

int ty_bytes(const std::string& m) {
  if (m == "u8" || m == "s8" || m == "b8") return 1;
  if (m == "u16" || m == "s16" || m == "b16" || m == "f16") return 2;
  if (m == "u32" || m == "s32" || m == "b32" || m == "f32") return 4;
  if (m == "u64" || m == "s64" || m == "b64" || m == "f64") return 8;
  return 0;
}

void need_args(const Instr& in, size_t n) {
  if (in.args.size() != n) {
    parse_fail(in.text, "takes " + std::to_string(n) + " operands, " + std::to_string(in.args.size()) + " given");
  }
}
void need_regs(const Instr& in, size_t arg, size_t n, const char* what) {
  if (in.args[arg].regs.size() != n || in.args[arg].addr) {
    parse_fail(in.text, std::string(what) + " needs " + std::to_string(n) + " register(s), " +
                            std::to_string(in.args[arg].regs.size()) + " given");
  }
}
void need_arch(const Instr& in, int arch, const char* what) {
  if (g_arch < arch) {
    parse_fail(in.text, std::string(what) + " needs sm_" + std::to_string(arch / 10) + " (this library is sm_" +
                            std::to_string(g_arch / 10) + ")");
  }
}

bool parse_sm90(Instr& in, const std::string& name, const std::vector<std::string>& mods);

Instr parse_instr(const std::string& stmt, const std::map<std::string, int>& locals) {
  Instr in;
  in.text = stmt;
  const size_t sp = stmt.find_first_of(" \t\n");
  const std::string opcode = sp == std::string::npos ? stmt : stmt.substr(0, sp);
  in.opcode = opcode;
  const std::string rest = sp == std::string::npos ? std::string() : trim(stmt.substr(sp));
  std::vector<std::string> mods;
  {
    size_t p = 0;
    while (p <= opcode.size()) {
      const size_t q = opcode.find('.', p);
      mods.push_back(opcode.substr(p, q == std::string::npos ? std::string::npos : q - p));
      if (q == std::string::npos) break;
      p = q + 1;
    }
  }
  const std::string name = mods[0];
  mods.erase(mods.begin());
  if (!rest.empty()) {
    std::string args = rest;
    if (name == "elect") std::replace(args.begin(), args.end(), '|', ',');  // elect.sync r|p, mask
    for (const std::string& a : split_top(args, ',')) in.args.push_back(parse_arg(a, locals, stmt));
  }
  auto has = [&](const char* m) { return std::find(mods.begin(), mods.end(), m) != mods.end(); };
  auto unknown = [&](std::initializer_list<const char*> allowed) {
    for (const std::string& m : mods) {
      bool ok = false;
      for (const char* a : allowed) ok |= m == a;
      if (!ok) parse_fail(stmt, "modifier ." + m + " of " + name + " is not one the emulator knows");
    }
  };
  if (name == "mov") {
    unknown({"b32", "u32", "f32"});
    in.op = Op::kMov;
    need_args(in, 2);
    return in;
  }
  if (name == "cvta") {
    if (!(mods.size() == 3 && mods[0] == "to" && mods[1] == "shared" && mods[2] == "u64")) {
      parse_fail(stmt, "only cvta.to.shared.u64 is emulated");
    }
    in.op = Op::kCvta;
    need_args(in, 2);
    return in;
  }
  if (name == "cvt") {
    in.op = Op::kCvt;
    std::vector<std::string> tys;
    for (const std::string& m : mods) {
      if (m == "rn") continue;
      if (m == "rz") {
        in.rz = true;
        continue;
      }
      if (m == "f16x2" || m == "bf16x2") {
        in.x2pack = true;
        tys.push_back(m.substr(0, m.size() - 2));
        continue;
      }
      if (parse_ty(m) == Ty::kNone) parse_fail(stmt, "modifier ." + m + " of cvt is not one the emulator knows");
      tys.push_back(m);
    }
    if (tys.size() != 2) parse_fail(stmt, "cvt needs a destination and a source type");
    in.dst = parse_ty(tys[0]);
    in.src = parse_ty(tys[1]);
    const bool narrowing = in.src == Ty::kF32 && (in.dst == Ty::kF16 || in.dst == Ty::kBF16);
    const bool rounding = has("rn") || in.rz;
    if (narrowing && !rounding) parse_fail(stmt, "a narrowing float cvt needs a rounding modifier (.rn, .rz)");
    if (!narrowing && rounding) parse_fail(stmt, "a rounding modifier on a cvt that does not round");
    if (in.x2pack) {
      need_args(in, 3);
      if (!narrowing) parse_fail(stmt, "cvt.*x2 converts two .f32 sources");
      if (in.dst == Ty::kBF16) need_arch(in, 800, "cvt.bf16x2");
      if (in.dst == Ty::kF16) need_arch(in, 800, "cvt.f16x2.f32");
    } else {
      need_args(in, 2);
      const bool ok = (in.dst == Ty::kF32 && in.src == Ty::kF16) || narrowing ||
                      (in.dst == Ty::kU32 && in.src == Ty::kU64);
      if (!ok) parse_fail(stmt, "this cvt is not one the emulator knows");
      if (in.dst == Ty::kBF16) need_arch(in, 800, "cvt.bf16.f32");
    }
    return in;
  }
  if (name == "ex2" || name == "lg2" || name == "rcp" || name == "tanh") {
    in.op = name == "ex2" ? Op::kEx2 : name == "lg2" ? Op::kLg2 : name == "rcp" ? Op::kRcp : Op::kTanh;
    if (!has("approx") || !has("f32")) parse_fail(stmt, name + " is emulated as ." "approx.f32 only");
    if (in.op == Op::kTanh) {
      unknown({"approx", "f32"});
    } else {
      unknown({"approx", "ftz", "f32"});
    }
    in.ftz = has("ftz");
    need_args(in, 2);
    return in;
  }
  if (name == "shfl") {
    unknown({"sync", "bfly", "up", "down", "idx", "b32"});
    if (!has("sync") || !has("b32")) parse_fail(stmt, "only shfl.sync.<mode>.b32 is emulated");
    in.op = Op::kShfl;
    in.shfl_mode = has("bfly") ? 'b' : has("up") ? 'u' : has("down") ? 'd' : has("idx") ? 'i' : 0;
    if (in.shfl_mode == 0) parse_fail(stmt, "shfl.sync needs a mode (.bfly .up .down .idx)");
    need_args(in, 5);
    in.collective = true;
    return in;
  }
  if (name == "ldmatrix") {
    unknown({"sync", "aligned", "m8n8", "x1", "x2", "x4", "trans", "shared", "shared::cta", "b16"});
    if (!has("sync") || !has("aligned") || !has("m8n8") || !has("b16") || !(has("shared") || has("shared::cta"))) {
      parse_fail(stmt, "only ldmatrix.sync.aligned.m8n8[.x1|.x2|.x4][.trans].shared.b16 is emulated");
    }
    in.op = Op::kLdmatrix;
    in.count = has("x4") ? 4 : has("x2") ? 2 : 1;
    in.trans = has("trans");
    need_args(in, 2);
    if (!in.args[1].addr) parse_fail(stmt, "ldmatrix's source is an address [..]");
    need_regs(in, 0, static_cast<size_t>(in.count), "ldmatrix's destination");
    in.collective = true;
    in.memory = true;
    return in;
  }
  if (name == "mma") {
    unknown({"sync", "aligned", "m16n8k16", "m16n8k8", "row", "col", "f32", "f16", "bf16"});
    if (!has("sync") || !has("aligned")) parse_fail(stmt, "mma without .sync.aligned");
    if (!(mods.size() == 9 && mods[2].rfind("m16n8k", 0) == 0 && mods[3] == "row" && mods[4] == "col")) {
      parse_fail(stmt, "only mma.sync.aligned.m16n8k{8,16}.row.col.<d>.<a>.<b>.<c> is emulated");
    }
    in.op = Op::kMma;
    in.k = mods[2] == "m16n8k16" ? 16 : 8;
    in.dst = parse_ty(mods[5]);
    in.src = parse_ty(mods[6]);
    if (in.dst != Ty::kF32 || parse_ty(mods[8]) != Ty::kF32) parse_fail(stmt, "only fp32 accumulators are emulated");
    if (in.src != parse_ty(mods[7]) || (in.src != Ty::kF16 && in.src != Ty::kBF16)) {
      parse_fail(stmt, "A and B must both be .f16 or both .bf16");
    }
    if (in.src == Ty::kBF16) need_arch(in, 800, "mma with .bf16");
    if (in.k == 16) need_arch(in, 800, "mma.m16n8k16");
    need_args(in, 4);
    need_regs(in, 0, 4, "mma's D");
    need_regs(in, 1, in.k == 16 ? 4 : 2, "mma's A");
    need_regs(in, 2, in.k == 16 ? 2 : 1, "mma's B");
    need_regs(in, 3, 4, "mma's C");
    in.collective = true;
    return in;
  }
  if (name == "cp") {
    if (mods.size() >= 2 && mods[1] == "bulk" && parse_sm90(in, name, mods)) return in;
    if (mods.empty() || mods[0] != "async") parse_fail(stmt, "unknown instruction cp." + (mods.empty() ? "" : mods[0]));
    need_arch(in, 800, "cp.async");
    in.memory = true;
    if (mods.size() == 2 && mods[1] == "commit_group") {
      in.op = Op::kCommit;
      need_args(in, 0);
      return in;
    }
    if (mods.size() == 2 && mods[1] == "wait_group") {
      in.op = Op::kWaitGroup;
      need_args(in, 1);
      if (in.args[0].regs[0].kind == RefKind::kLocal) parse_fail(stmt, "wait_group takes an immediate");
      return in;
    }
    if (mods.size() == 2 && mods[1] == "wait_all") {
      in.op = Op::kWaitAll;
      need_args(in, 0);
      return in;
    }
    in.op = Op::kCpAsync;
    const bool cg = has("cg"), ca = has("ca");
    if (cg == ca || !(has("shared") || has("shared::cta")) || !has("global")) {
      parse_fail(stmt, "only cp.async.{ca,cg}.shared.global is emulated");
    }
    for (size_t i = 1; i < mods.size(); ++i) {
      const std::string& m = mods[i];
      if (m != "ca" && m != "cg" && m != "shared" && m != "shared::cta" && m != "global") {
        parse_fail(stmt, "modifier ." + m + " of cp.async is not one the emulator knows");
      }
    }
    if (in.args.size() != 3 && in.args.size() != 4) parse_fail(stmt, "cp.async takes [dst], [src], cp-size[, src-size]");
    if (!in.args[0].addr || !in.args[1].addr) parse_fail(stmt, "cp.async's first two operands are addresses");
    const Ref& size = in.args[2].regs[0];
    if (size.kind != RefKind::kImm) parse_fail(stmt, "cp.async's cp-size is an immediate");
    in.bytes = static_cast<int>(size.v);
    if (cg ? in.bytes != 16 : (in.bytes != 4 && in.bytes != 8 && in.bytes != 16)) {
      parse_fail(stmt, cg ? "cp.async.cg copies 16 bytes" : "cp.async.ca copies 4, 8 or 16 bytes");
    }
    in.ftz = cg;  // (unused: .cg and .ca differ in caching only)
    return in;
  }
  if (name == "ld" || name == "st") {
    in.op = name == "ld" ? Op::kLd : Op::kSt;
    in.memory = true;
    for (const std::string& m : mods) {
      if (m == "shared" || m == "shared::cta") {
        in.shared = true;
      } else if (m == "global") {
        in.global = true;
      } else if (m == "nc") {
        in.nc = true;
      } else if (m == "v2" || m == "v4") {
        in.count = m[1] - '0';
      } else if (ty_bytes(m) != 0) {
        in.bytes = ty_bytes(m);
      } else if (m == "weak" || m == "ca" || m == "cg" || m == "cs" || m == "lu" || m == "cv" || m == "wb" ||
                 m == "wt") {
      } else {
        parse_fail(stmt, "modifier ." + m + " of " + name + " is not one the emulator knows");
      }
    }
    if (in.shared == in.global) parse_fail(stmt, name + " needs exactly one state space (.shared or .global)");
    if (in.nc && (in.op != Op::kLd || !in.global)) parse_fail(stmt, ".nc is for ld.global only");
    need_args(in, 2);
    const int data = in.op == Op::kLd ? 0 : 1;
    if (!in.args[1 - data].addr) parse_fail(stmt, name + "'s address operand is [..]");
    if (in.count > 1 && !in.args[data].vec) parse_fail(stmt, "a .v" + std::to_string(in.count) + " form moves {..}");
    need_regs(in, static_cast<size_t>(data), static_cast<size_t>(in.count), "the moved data");
    return in;
  }
  if (name == "red") {
    in.op = Op::kRed;
    in.memory = true;
    bool add = false, f32 = false;
    for (const std::string& m : mods) {
      if (m == "global") {
        in.global = true;
      } else if (m == "add") {
        add = true;
      } else if (m == "f32") {
        f32 = true;
      } else if (m == "v2" || m == "v4") {
        in.count = m[1] - '0';
      } else if (m != "relaxed" && m != "gpu") {
        parse_fail(stmt, "modifier ." + m + " of red is not one the emulator knows");
      }
    }
    if (!in.global || !add || !f32) parse_fail(stmt, "only red.global.add[.v2|.v4].f32 is emulated");
    if (in.count > 1) need_arch(in, 900, "red with a vector type");
    need_args(in, 2);
    if (!in.args[0].addr) parse_fail(stmt, "red's first operand is an address");
    need_regs(in, 1, static_cast<size_t>(in.count), "red's data");
    return in;
  }
  if (parse_sm90(in, name, mods)) return in;
  parse_fail(stmt, "unknown instruction '" + opcode + "'");
}

// The sm_90 / sm_90a forms hopper.cuh uses (PTX ISA 8.x); false for a name that is none of them.
bool parse_sm90(Instr& in, const std::string& name, const std::vector<std::string>& mods) {
  const std::string& stmt = in.text;
  auto has = [&](const char* m) { return std::find(mods.begin(), mods.end(), m) != mods.end(); };
  auto only = [&](std::initializer_list<const char*> allowed, const char* form) {
    for (const std::string& m : mods) {
      bool ok = false;
      for (const char* a : allowed) ok |= m == a;
      if (!ok) parse_fail(stmt, "modifier ." + m + " is not one the emulator knows (emulated: " + form + ")");
    }
  };
  auto need_sm90a = [&](const char* what) {
    need_arch(in, 900, what);
    if (!g_arch_specific) parse_fail(stmt, std::string(what) + " needs sm_90a (this library is plain sm_90)");
  };
  if (name == "setp") {
    only({"ne", "eq", "b32", "u32", "s32"}, "setp.{ne,eq}.{b32,u32,s32}");
    in.op = Op::kSetp;
    in.trans = has("eq");
    need_args(in, 3);
    return true;
  }
  if (name == "selp") {
    only({"u32", "b32", "s32"}, "selp.{u32,b32,s32}");
    in.op = Op::kSelp;
    need_args(in, 4);
    return true;
  }
  if (name == "elect") {
    only({"sync"}, "elect.sync d|p, membermask");
    need_arch(in, 900, "elect.sync");
    in.op = Op::kElect;
    need_args(in, 3);
    in.collective = true;
    return true;
  }
  if (name == "wgmma") {
    need_sm90a(in.opcode.c_str());
    if (!has("sync") || !has("aligned")) parse_fail(stmt, "wgmma without .sync.aligned");
    in.collective = true;
    if (mods.size() == 3 && mods[0] == "fence") {
      in.op = Op::kWgFence;
      need_args(in, 0);
      return true;
    }
    if (mods.size() == 3 && mods[0] == "commit_group") {
      in.op = Op::kWgCommit;
      need_args(in, 0);
      return true;
    }
    if (mods.size() == 3 && mods[0] == "wait_group") {
      in.op = Op::kWgWait;
      need_args(in, 1);
      if (in.args[0].regs[0].kind == RefKind::kLocal) parse_fail(stmt, "wait_group takes an immediate");
      return true;
    }
    int n = 0;
    if (mods.size() != 7 || mods[0] != "mma_async" || sscanf(mods[3].c_str(), "m64n%dk16", &n) != 1 ||
        mods[3] != "m64n" + std::to_string(n) + "k16") {
      parse_fail(stmt, "only wgmma.mma_async.sync.aligned.m64n<N>k16.f32.<a>.<b> is emulated");
    }
    if (n < 8 || n > 256 || n % 8 != 0) parse_fail(stmt, "wgmma's N is a multiple of 8 from 8 to 256");
    in.op = Op::kWgmma;
    in.memory = true;
    in.n = n;
    in.dst = parse_ty(mods[4]);
    in.src = parse_ty(mods[5]);
    if (in.dst != Ty::kF32) parse_fail(stmt, "only fp32 accumulators are emulated");
    if (in.src != parse_ty(mods[6]) || (in.src != Ty::kF16 && in.src != Ty::kBF16)) {
      parse_fail(stmt, "A and B must both be .f16 or both .bf16");
    }
    if (in.args.size() != 8 && in.args.size() != 7) {
      parse_fail(stmt, "wgmma takes d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b "
                       "(A from shared memory) or d, {a}, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b");
    }
    in.trans = in.args.size() == 7;  // A from registers
    need_regs(in, 0, static_cast<size_t>(n / 2), "wgmma's D");
    if (in.trans) need_regs(in, 1, 4, "wgmma's A (registers)");
    return true;
  }
  if (name == "mbarrier") {
    need_arch(in, 900, "mbarrier (as hopper.cuh uses it)");
    in.memory = true;
    const bool cta = has("shared::cta") || has("shared");
    if (!cta || !has("b64")) parse_fail(stmt, "only mbarrier.*.shared::cta.b64 is emulated");
    if (mods[0] == "init") {
      only({"init", "shared::cta", "shared", "b64"}, "mbarrier.init.shared::cta.b64 [addr], count");
      in.op = Op::kMbarInit;
      need_args(in, 2);
      return true;
    }
    if (mods[0] == "arrive") {
      only({"arrive", "expect_tx", "release", "cta", "shared::cta", "shared", "b64"},
           "mbarrier.arrive[.expect_tx].shared::cta.b64 _, [addr][, tx]");
      in.op = Op::kMbarArrive;
      in.expect_tx = has("expect_tx");
      need_args(in, in.expect_tx ? 3 : 2);
      if (!in.args[1].addr) parse_fail(stmt, "mbarrier.arrive's second operand is [addr]");
      return true;
    }
    if (mods[0] == "expect_tx") {
      only({"expect_tx", "relaxed", "cta", "shared::cta", "shared", "b64"},
           "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [addr], tx");
      in.op = Op::kMbarExpectTx;
      need_args(in, 2);
      return true;
    }
    if (mods[0] == "try_wait") {
      only({"try_wait", "parity", "acquire", "cta", "shared::cta", "shared", "b64"},
           "mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity");
      if (!has("parity")) parse_fail(stmt, "only the .parity form of mbarrier.try_wait is emulated");
      in.op = Op::kMbarTryWait;
      need_args(in, 3);
      return true;
    }
    parse_fail(stmt, "mbarrier." + mods[0] + " is not emulated");
  }
  if (name == "fence") {
    const bool proxy = mods.size() == 3 && mods[0] == "proxy" && mods[1] == "async" && mods[2] == "shared::cta";
    const bool init = mods.size() == 3 && mods[0] == "mbarrier_init" && mods[1] == "release" && mods[2] == "cluster";
    if (!proxy && !init) parse_fail(stmt, "only fence.proxy.async.shared::cta and fence.mbarrier_init are emulated");
    in.op = Op::kFence;
    in.trans = proxy;
    in.memory = true;
    need_args(in, 0);
    return true;
  }
  if (name == "bar") {
    only({"sync", "arrive"}, "bar.sync id, threads / bar.arrive id, threads");
    in.op = has("arrive") ? Op::kBarArrive : Op::kBarSync;
    need_args(in, 2);
    return true;
  }
  if (name == "prefetch") {
    only({"tensormap"}, "prefetch.tensormap [addr]");
    in.op = Op::kPrefetchTmap;
    need_args(in, 1);
    return true;
  }
  if (name == "cp" && mods.size() >= 3 && mods[0] == "async" && mods[1] == "bulk" && mods[2] == "tensor") {
    need_arch(in, 900, "cp.async.bulk.tensor");
    int rank = 0;
    if (mods.size() != 7 || sscanf(mods[3].c_str(), "%dd", &rank) != 1 || rank < 1 || rank > 5 ||
        mods[3] != std::to_string(rank) + "d" || mods[4] != "shared::cluster" || mods[5] != "global" ||
        mods[6] != "mbarrier::complete_tx::bytes") {
      parse_fail(stmt, "only cp.async.bulk.tensor.<n>d.shared::cluster.global.mbarrier::complete_tx::bytes is emulated");
    }
    in.op = Op::kTma;
    in.memory = true;
    in.n = rank;
    need_args(in, 3);
    if (!in.args[0].addr || !in.args[1].addr || !in.args[2].addr) parse_fail(stmt, "[dst], [map, {coords}], [mbar]");
    if (in.args[1].regs.size() != static_cast<size_t>(rank) + 1) {
      parse_fail(stmt, "a " + std::to_string(rank) + "d copy takes " + std::to_string(rank) + " coordinates");
    }
    return true;
  }
  if (name == "setmaxnreg") {
    need_sm90a("setmaxnreg");
    only({"inc", "dec", "sync", "aligned", "u32"}, "setmaxnreg.{inc,dec}.sync.aligned.u32 n");
    if (!has("sync") || !has("aligned") || has("inc") == has("dec")) parse_fail(stmt, "setmaxnreg.{inc,dec}.sync.aligned.u32");
    in.op = Op::kSetmaxnreg;
    in.expect_tx = has("inc");
    in.collective = true;
    need_args(in, 1);
    return true;
  }
  return false;
}

Program parse_program(const char* text) {
  Program prog;
  std::map<std::string, int> locals;
  const std::string s = text;
  size_t i = 0;
  int depth = 0;
  while (i < s.size()) {
    while (i < s.size() && isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i >= s.size()) break;
    if (s[i] == '{') {
      ++depth;
      ++i;
      continue;
    }
    if (s[i] == '}') {
      if (--depth < 0) parse_fail(s, "unbalanced }");
      ++i;
      continue;
    }
    const size_t end = s.find(';', i);
    if (end == std::string::npos) parse_fail(s, "statement without ';': " + s.substr(i));
    const std::string stmt = trim(s.substr(i, end - i));
    i = end + 1;
    if (stmt.rfind(".reg", 0) == 0) {  // .reg .u64 t[, u];
      std::string decl = trim(stmt.substr(4));
      const size_t sp = decl.find_first_of(" \t");
      if (decl.empty() || decl[0] != '.' || sp == std::string::npos) parse_fail(s, "malformed '" + stmt + "'");
      if (depth == 0) parse_fail(s, "'" + stmt + "' outside a { } scope");
      for (const std::string& n : split_top(decl.substr(sp), ',')) {
        if (prog.locals >= kMaxLocals) parse_fail(s, "more than 4 local registers");
        locals[n] = prog.locals++;
      }
      continue;
    }
    prog.instrs.push_back(parse_instr(stmt, locals));
  }
  if (depth != 0) parse_fail(s, "unbalanced {");
  return prog;
}

// One thread's register file while it runs one asm statement.
struct Regs {
  uint64_t local[kMaxLocals];
  size_t n = 0;  // operands in use: a collective copies these, not all kMaxOps
  uint64_t op[kMaxOps];
};

inline void copy_regs(Regs& to, const Regs& from) {
  memcpy(to.local, from.local, sizeof from.local);
  to.n = from.n;
  memcpy(to.op, from.op, from.n * sizeof(uint64_t));
}

inline uint64_t get(const Regs& r, const Ref& ref) {
  switch (ref.kind) {
    case RefKind::kOperand:
      return r.op[ref.v];
    case RefKind::kLocal:
      return r.local[ref.v];
    case RefKind::kImm:
      return static_cast<uint64_t>(ref.v);
    default:
      return 0;
  }
}

// ---- fibers and blocks -----------------------------------------------------------------------------
enum class State { kReady, kWaitWarp, kWaitBlock, kWaitWarpgroup, kWaitMbar, kWaitNamed, kWaitRegs, kDone };

struct CopyOp {  // one cp.async
  uint32_t dst;
  const void* src;
  int bytes, src_bytes;
};

struct Block;

// An accumulator register of a wgmma its warpgroup has not retired: the result it will hold, the group
// (commit number) whose wait_group retires it, and the instruction.
struct PendingAcc {
  uint32_t value;
  int group;
  const Instr* ins;
};

struct Fiber {
  ucontext_t ctx;  // the first entry only (makecontext); later switches use jb
  jmp_buf jb;
  bool started = false;
  char* stack = nullptr;
  Block* blk = nullptr;
  Dim3 tid;
  int index = 0;  // linear thread index in the block
  State state = State::kDone;
  std::vector<CopyOp> open_group;             // cp.async issued since the last commit
  std::deque<std::vector<CopyOp>> committed;  // oldest first
  std::unordered_map<uintptr_t, int> site_count;  // executions of each call site since the last barrier
  // sm_90a
  const Operand* outs = nullptr;  // the outputs of the asm statement running (for wgmma's accumulators)
  size_t n_outs = 0;
  std::unordered_map<uintptr_t, PendingAcc> pending;  // by the address of the kernel's register variable
  uintptr_t pending_lo = UINTPTR_MAX, pending_hi = 0;
  bool wg_fenced = false;                  // executed a wgmma.fence
  std::unordered_set<uintptr_t> dirty;     // register variables written by ordinary code since it
  std::vector<std::pair<uint32_t, uint32_t>> observed;  // mbarrier -> phases this thread saw complete
  uint32_t wait_bar = 0, wait_parity = 0;
  uint32_t proxy_fences = 0;  // fence.proxy.async executed
  // Release by mbarrier arrival: this thread's shared-memory writes so far (counted) and, per arrival,
  // the mbarrier, the phase count its completion reaches and the write count then. A thread that saw
  // that phase complete may read what this thread wrote before the arrival (mbarrier.arrive releases,
  // try_wait acquires; PTX ISA "Memory Consistency Model").
  uint32_t smem_writes = 0;
  struct Release {
    uint32_t bar, phase, writes;
  };
  std::vector<Release> releases;
};

enum AccessKind { kAccLd, kAccSt, kAccCpAsync, kAccLdmatrix, kAccKinds };

struct BankStats {
  uint64_t instructions = 0, wavefronts = 0, ideal = 0;
};

struct AccessGroup {
  int kind = 0;
  uint32_t bytes = 0;
  uint32_t lanes = 0;
  uint32_t addr[32];
};

struct WarpOp {
  int arrived = 0;
  const Instr* ins = nullptr;
  uintptr_t site = 0;
  Regs lanes[kWarpSize];
};

constexpr int32_t kAsyncWritten = -2;  // Shadow::w_epoch of a byte a TMA wrote

struct Shadow {
  int32_t w_epoch = -1;
  int16_t w_tid = -1;
  int16_t r_tid = -1;
  int32_t r_epoch = -1;
  int16_t pending_tid = -1;
  uint16_t async_reads = 0;  // wgmmas not yet retired that read the byte
  int32_t tma_bar = -1;      // kAsyncWritten: the mbarrier the TMA completed on, and its phase then
  uint32_t tma_phase = 0;
  uint32_t w_fences = 0;     // the writer's fence.proxy.async count when it wrote (a generic write)
  uint32_t w_seq = 0;        // the writer's smem_writes count after this write (a generic write)
};
constexpr int16_t kManyReaders = -2;

// An mbarrier object (PTX ISA "mbarrier"): arrivals and transaction bytes of the current phase.
struct Mbar {
  uint32_t count = 0, pending = 0;
  int64_t tx = 0;
  uint32_t phase = 0;  // phases completed
  // What the arriving threads of the current phase had seen of the mbarriers, and, per completed phase
  // count, what a thread that sees it complete learns (cumulative: release is transitive).
  std::vector<std::pair<uint32_t, uint32_t>> arriving;
  std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> released;
};

// The wgmmas a warpgroup committed together (wgmma.commit_group), with the shared memory they read.
struct WgGroup {
  int number = 0;
  std::vector<uint32_t> reads;  // 2-byte elements
};

struct Warpgroup {
  int arrived = 0;
  const Instr* ins = nullptr;
  uintptr_t site = 0;
  std::vector<Regs> lanes;
  WgGroup open;
  std::deque<WgGroup> closed;  // oldest first
  int regs = 0;                // per-thread register count (setmaxnreg)
};

struct NamedBarrier {
  int arrived = 0, expected = 0;
  std::vector<std::pair<uint32_t, uint32_t>> seen;  // what the arrivals observed of the mbarriers
};

struct Block {
  Dim3 idx;
  int64_t id = -1;  // linear index in the grid; -1: the slot is free
  unsigned char* smem = nullptr;
  std::vector<Fiber> fibers;
  std::vector<WarpOp> warps;
  int barrier_arrived = 0;
  int32_t epoch = 0;
  int live = 0;
  std::vector<Shadow> shadow;
  std::map<std::tuple<int, uintptr_t, int>, AccessGroup> groups;
  std::map<uint32_t, Mbar> mbars;
  std::vector<Warpgroup> wgs;
  NamedBarrier named[16];
};

// A registered global buffer, with the guard bytes around it and a per-byte record of which block
// touched it in the current launch.
// One 4-byte word of a buffer (rows and the kernels' stores are 4-byte aligned, so two blocks never
// share a word legitimately).
struct Cell {
  int32_t writer = -1;  // linear block id of the last writer, kAtomic added when it wrote by red.add
  int32_t reader = -1;  // linear block id, or kManyReaders
};
constexpr int32_t kAtomic = 1 << 30;
constexpr uintptr_t kCellBytes = 4;

struct Allocation {
  uintptr_t begin, end, guard_begin, guard_end;
  std::string name;
  std::vector<Cell> cells;  // per kCellBytes, filled at the first access of each launch
  uint32_t launch = 0;
};

struct Limits {
  int max_threads = 0, registers = 0, static_smem = 0, smem_limit = 0;
};
constexpr int kRegistersPerBlock = 64 * 1024;
constexpr int kRegisterUnit = 256;
constexpr size_t kStackBytes = 256 * 1024;
constexpr uint64_t kMemoryYield = 4;

struct Global {
  Limits limits;
  Dim3 grid_dim, block_dim;
  int smem_bytes = 0;
  int threads = 0;
  int window = 8;
  uint64_t seed = 1;
  uint64_t rng = 1;
  std::vector<std::unique_ptr<Block>> blocks;
  unsigned char* smem_arena = nullptr;  // window slots of kMaxSmem bytes
  size_t smem_slots = 0;
  Fiber* cur = nullptr;
  ucontext_t sched;
  jmp_buf sched_jb;  // where a fiber returns to the scheduler (_longjmp: no signal-mask system call)
  std::vector<Fiber*> ready;
  std::vector<Allocation> allocations;
  uintptr_t alloc_lo = UINTPTR_MAX, alloc_hi = 0;
  uint32_t launch = 0;
  std::string error;
  bool failed = false;
  uint64_t collectives = 0;
  BankStats banks[kAccKinds];
  std::unordered_map<const char*, std::unique_ptr<Program>> programs;
};

static Global g;

inline int lane_of(const Fiber* f) { return f->index % kWarpSize; }
inline int warp_of(const Fiber* f) { return f->index / kWarpSize; }

void fail(const char* fmt, ...) {
  if (!g.failed) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g.error = buf;
    if (g.cur != nullptr) {
      const Block* b = g.cur->blk;
      char where[160];
      snprintf(where, sizeof where, " [block (%u, %u, %u), thread %d (warp %d, lane %d)]", b->idx.x, b->idx.y,
               b->idx.z, g.cur->index, warp_of(g.cur), lane_of(g.cur));
      g.error += where;
    }
    g.failed = true;
  }
  if (g.cur != nullptr) {  // abandon this fiber: back to the scheduler for good
    g.cur->state = State::kDone;
    _longjmp(g.sched_jb, 1);
  }
}

inline uint64_t next_random() {  // splitmix64
  uint64_t z = (g.rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline void make_ready(Fiber* f) {
  f->state = State::kReady;
  g.ready.push_back(f);
}

// Suspend the current fiber until someone makes it ready again.
inline void block_here(State why) {
  Fiber* f = g.cur;
  f->state = why;
  if (_setjmp(f->jb) == 0) _longjmp(g.sched_jb, 1);
  if (g.failed) fail("abandoned");
}

// A scheduling point: the scheduler may run any ready fiber of the window before this one goes on.
inline void yield() {
  if (g.ready.empty()) return;
  make_ready(g.cur);
  block_here(State::kReady);
}

// ---- global memory -----------------------------------------------------------------------------------
inline void block_coords(int64_t id, unsigned* x, unsigned* y, unsigned* z) {
  *x = static_cast<unsigned>(id % g.grid_dim.x);
  *y = static_cast<unsigned>(id / g.grid_dim.x % g.grid_dim.y);
  *z = static_cast<unsigned>(id / g.grid_dim.x / g.grid_dim.y);
}

Allocation* find_allocation(uintptr_t a, size_t n, bool guarded) {
  if (a + n <= g.alloc_lo || a >= g.alloc_hi) return nullptr;
  for (Allocation& al : g.allocations) {
    if (guarded ? (a < al.guard_end && a + n > al.guard_begin) : (a >= al.begin && a + n <= al.end)) return &al;
  }
  return nullptr;
}

enum class GAccess { kRead, kWrite, kAtomic };

// The launch-wide record of which block touched each byte: the race rule between blocks.
void record_global(Allocation& al, uintptr_t a, size_t n, GAccess how, const char* what) {
  const int32_t me = static_cast<int32_t>(g.cur->blk->id);
  if (al.launch != g.launch) {
    al.cells.assign((al.end - al.begin + kCellBytes - 1) / kCellBytes, Cell{});
    al.launch = g.launch;
  }
  const size_t first = (a - al.begin) / kCellBytes, last = (a + n - 1 - al.begin) / kCellBytes;
  for (size_t i = first; i <= last; ++i) {
    Cell& c = al.cells[i];
    const bool atomic = c.writer >= kAtomic;
    const int32_t writer = atomic ? c.writer - kAtomic : c.writer;
    int32_t other = -1;
    const char* rule = nullptr;
    if (how == GAccess::kRead) {
      if (writer >= 0 && writer != me) {
        other = writer;
        rule = atomic ? "reads a byte block %s adds to with red.add" : "reads a byte block %s wrote";
      }
    } else if (how == GAccess::kWrite) {
      if (writer >= 0 && writer != me) {
        other = writer;
        rule = atomic ? "writes (non-atomic) a byte block %s adds to with red.add" : "writes a byte block %s also wrote";
      } else if (c.reader != -1 && c.reader != me) {
        other = c.reader;
        rule = "writes a byte block %s read";
      }
    } else {
      if (writer >= 0 && writer != me && !atomic) {
        other = writer;
        rule = "red.add to a byte block %s wrote non-atomically";
      } else if (c.reader != -1 && c.reader != me) {
        other = c.reader;
        rule = "red.add to a byte block %s read";
      }
    }
    if (rule != nullptr) {
      char who[64];
      if (other == kManyReaders) {
        snprintf(who, sizeof who, "(several blocks)");
      } else {
        unsigned x, y, z;
        block_coords(other, &x, &y, &z);
        snprintf(who, sizeof who, "(%u, %u, %u)", x, y, z);
      }
      char msg[256];
      snprintf(msg, sizeof msg, rule, who);
      const size_t at = std::max(static_cast<size_t>(a - al.begin), i * kCellBytes);
      fail("%s: race between blocks of one launch: %s, at byte %zu of '%s' (plain accesses of one address from two "
           "blocks need an atomic or separate launches)",
           what, msg, at, al.name.c_str());
    }
    if (how == GAccess::kRead) {
      if (c.reader == -1) {
        c.reader = me;
      } else if (c.reader != me) {
        c.reader = kManyReaders;
      }
    } else {
      c.writer = how == GAccess::kAtomic ? me + kAtomic : me;
    }
  }
}

// A PTX access of global memory: inside a registered buffer, aligned; recorded for the race rule.
void check_global(uintptr_t a, size_t n, size_t align, GAccess how, const char* what) {
  if (a % align != 0) fail("%s: global address %p is not %zu-byte aligned", what, reinterpret_cast<void*>(a), align);
  Allocation* al = find_allocation(a, n, false);
  if (al != nullptr) {
    record_global(*al, a, n, how, what);
    return;
  }
  const Allocation* near = nullptr;
  uintptr_t best = UINTPTR_MAX;
  for (const Allocation& x : g.allocations) {
    const uintptr_t d = a < x.begin ? x.begin - a : a - x.begin;
    if (d < best) best = d, near = &x;
  }
  if (near != nullptr) {
    fail("%s: global access [%p, +%zu) is outside every buffer (nearest: %s, [%p, %p), offset %lld)", what,
         reinterpret_cast<void*>(a), n, near->name.c_str(), reinterpret_cast<void*>(near->begin),
         reinterpret_cast<void*>(near->end), static_cast<long long>(a) - static_cast<long long>(near->begin));
  }
  fail("%s: global access [%p, +%zu) and no buffer is registered", what, reinterpret_cast<void*>(a), n);
}

// ---- shared memory -----------------------------------------------------------------------------------
inline void check_smem_range(uint32_t addr, uint32_t n, uint32_t align, const char* what) {
  if (addr % align != 0) fail("%s: shared address %u is not %u-byte aligned", what, addr, align);
  if (static_cast<uint64_t>(addr) + n > static_cast<uint64_t>(g.smem_bytes)) {
    fail("%s: shared access [%u, %u) is outside the launch's %d bytes of dynamic shared memory", what, addr,
         addr + n, g.smem_bytes);
  }
}

inline void count_wavefronts(const AccessGroup& grp) {
  const uint32_t per_phase = 128 / grp.bytes;
  uint64_t wavefronts = 0, active = 0;
  for (uint32_t p0 = 0; p0 < 32; p0 += per_phase) {
    uint32_t words[32][32];
    int count[32] = {0};
    int worst = 0;
    for (uint32_t l = p0; l < p0 + per_phase; ++l) {
      if (!(grp.lanes >> l & 1u)) continue;
      ++active;
      for (uint32_t w = 0; w < grp.bytes / 4; ++w) {
        const uint32_t word = grp.addr[l] / 4 + w, bank = word % 32;
        bool seen = false;
        for (int i = 0; i < count[bank]; ++i) seen |= words[bank][i] == word;
        if (!seen) words[bank][count[bank]++] = word;
        worst = std::max(worst, count[bank]);
      }
    }
    wavefronts += static_cast<uint64_t>(worst);
  }
  BankStats& st = g.banks[grp.kind];
  st.instructions += 1;
  st.wavefronts += wavefronts;
  st.ideal += (active * grp.bytes + 127) / 128;
}

inline void record_access(int kind, uint32_t addr, uint32_t bytes, uintptr_t site) {
  Fiber* f = g.cur;
  const int k = f->site_count[site]++;
  AccessGroup& grp = f->blk->groups[std::make_tuple(warp_of(f), site, k)];
  grp.kind = kind;
  grp.bytes = bytes;
  grp.lanes |= 1u << lane_of(f);
  grp.addr[lane_of(f)] = addr;
}

inline void flush_accesses(Block& b) {
  for (const auto& entry : b.groups) count_wavefronts(entry.second);
  b.groups.clear();
  for (Fiber& f : b.fibers) f.site_count.clear();
}

inline uint32_t seen_phases(const Fiber* f, uint32_t bar) {
  for (const auto& e : f->observed) {
    if (e.first == bar) return e.second;
  }
  return 0;
}

inline void see_phases(std::vector<std::pair<uint32_t, uint32_t>>& into, uint32_t bar, uint32_t phases) {
  for (auto& e : into) {
    if (e.first == bar) {
      e.second = std::max(e.second, phases);
      return;
    }
  }
  into.emplace_back(bar, phases);
}

// A byte a TMA wrote is readable by a thread that saw the mbarrier phase it completed on complete
// (mbarrier.try_wait.parity), itself or through a barrier with a thread that did.
inline void check_tma_seen(const Fiber* f, const Shadow& s, uint32_t addr, const char* what) {
  if (seen_phases(f, static_cast<uint32_t>(s.tma_bar)) <= s.tma_phase) {
    fail("%s: reads shared byte %u, which a TMA (cp.async.bulk.tensor) writes on the mbarrier at %d in its phase %u, "
         "before thread %d waited for that phase to complete (race)",
         what, addr, s.tma_bar, s.tma_phase, f->index);
  }
}

// Whether thread `reader` may read a byte that thread s.w_tid wrote with a generic store in this epoch
// (no __syncthreads between): the writer arrived on an mbarrier after the write and the reader saw
// that phase complete (itself, through another mbarrier's release, or through a barrier).
inline bool published_to(const Block& b, const Shadow& s, const Fiber& reader) {
  if (s.w_tid < 0) return false;
  for (const Fiber::Release& r : b.fibers[static_cast<size_t>(s.w_tid)].releases) {
    if (r.writes >= s.w_seq && seen_phases(&reader, r.bar) >= r.phase) return true;
  }
  return false;
}

// Race checks of a read by the current thread (no data moved).
inline void smem_check_read(uint32_t addr, uint32_t n, uint32_t align, const char* what) {
  check_smem_range(addr, n, align, what);
  Block& b = *g.cur->blk;
  const int16_t me = static_cast<int16_t>(g.cur->index);
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& s = b.shadow[addr + i];
    if (s.pending_tid >= 0) {
      fail("%s: reads shared byte %u before the cp.async of thread %d that writes it was waited for", what,
           addr + i, s.pending_tid);
    }
    if (s.w_epoch == kAsyncWritten) {
      check_tma_seen(g.cur, s, addr + i, what);
    } else if (s.w_epoch < 0) {
      fail("%s: reads shared byte %u, which nothing has written", what, addr + i);
    } else if (s.w_epoch == b.epoch && s.w_tid != me && !published_to(b, s, *g.cur)) {
      fail("%s: reads shared byte %u written by thread %d with no __syncthreads between (race); an mbarrier arrival "
           "after the write whose phase this thread saw complete would order them",
           what, addr + i, s.w_tid);
    }
    if (s.r_epoch != b.epoch) {
      s.r_epoch = b.epoch;
      s.r_tid = me;
    } else if (s.r_tid != me) {
      s.r_tid = kManyReaders;
    }
  }
}

inline void smem_claim(uint32_t addr, uint32_t n, int16_t me, const char* what) {
  Block& b = *g.cur->blk;
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& s = b.shadow[addr + i];
    if (s.pending_tid >= 0 && s.pending_tid != me) {
      fail("%s: writes shared byte %u while a cp.async of thread %d to it is in flight (race)", what, addr + i,
           s.pending_tid);
    }
    if (s.async_reads > 0) {
      fail("%s: writes shared byte %u, which a wgmma no wgmma.wait_group has retired still reads (race)", what,
           addr + i);
    }
    if (s.w_epoch == b.epoch && s.w_tid != me) {
      fail("%s: writes shared byte %u also written by thread %d with no __syncthreads between (race)", what,
           addr + i, s.w_tid);
    }
    if (s.r_epoch == b.epoch && s.r_tid != me) {
      fail("%s: writes shared byte %u read by thread %d with no __syncthreads between (race)", what, addr + i,
           s.r_tid == kManyReaders ? -1 : s.r_tid);
    }
  }
}

inline void smem_check_write(uint32_t addr, uint32_t n, uint32_t align, const char* what) {
  check_smem_range(addr, n, align, what);
  Block& b = *g.cur->blk;
  const int16_t me = static_cast<int16_t>(g.cur->index);
  smem_claim(addr, n, me, what);
  const uint32_t seq = ++g.cur->smem_writes;
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& s = b.shadow[addr + i];
    s.w_epoch = b.epoch;
    s.w_tid = me;
    s.w_fences = g.cur->proxy_fences;
    s.w_seq = seq;
  }
}

inline void smem_read(uint32_t addr, void* dst, uint32_t n, uint32_t align, const char* what) {
  smem_check_read(addr, n, align, what);
  memcpy(dst, g.cur->blk->smem + addr, n);
}

inline void smem_write(uint32_t addr, const void* src, uint32_t n, uint32_t align, const char* what) {
  smem_check_write(addr, n, align, what);
  memcpy(g.cur->blk->smem + addr, src, n);
}

// ---- the kernels' plain C++ accesses (g++ -fsanitize=thread calls these before each one) ---------------
bool g_hooks_on = false;  // only while a kernel runs

void plain_access(uintptr_t a, size_t n, bool write) {
  if (!g_hooks_on || g.cur == nullptr || g.failed) return;
  Fiber* f = g.cur;
  if (!f->pending.empty() && a < f->pending_hi && a + n > f->pending_lo) {
    for (uintptr_t w = a & ~uintptr_t{3}; w < a + n; w += 4) {
      auto it = f->pending.find(w);
      if (it != f->pending.end()) {
        fail("plain C++ %s of an accumulator register (at %p) of '%s' before the wgmma.wait_group that retires its "
             "group: the register is undefined until then",
             write ? "store" : "load", reinterpret_cast<void*>(w), it->second.ins->text.c_str());
      }
    }
  }
  if (write && f->wg_fenced && a >= reinterpret_cast<uintptr_t>(f->stack) &&
      a < reinterpret_cast<uintptr_t>(f->stack) + kStackBytes) {
    for (uintptr_t w = a & ~uintptr_t{3}; w < a + n; w += 4) f->dirty.insert(w);
  }
  const uintptr_t arena = reinterpret_cast<uintptr_t>(g.smem_arena);
  if (a >= arena && a < arena + g.smem_slots * kMaxSmem) {
    Block& b = *g.cur->blk;
    const uintptr_t own = reinterpret_cast<uintptr_t>(b.smem);
    if (a < own || a + n > own + kMaxSmem) {
      fail("plain %s of %zu bytes at %p: another block's shared memory", write ? "store" : "load", n,
           reinterpret_cast<void*>(a));
    }
    const uint32_t off = static_cast<uint32_t>(a - own);
    if (write) {
      smem_check_write(off, static_cast<uint32_t>(n), 1, "plain C++ store to shared memory");
    } else {
      smem_check_read(off, static_cast<uint32_t>(n), 1, "plain C++ load from shared memory");
    }
    return;
  }
  Allocation* al = find_allocation(a, n, true);
  if (al == nullptr) return;  // the fiber's stack, the kernel's arguments, the emulator's own data
  const char* what = write ? "plain C++ store to global memory" : "plain C++ load from global memory";
  if (a < al->begin || a + n > al->end) {
    fail("%s: [%p, +%zu) is outside the buffer '%s' ([%p, %p), offset %lld)", what, reinterpret_cast<void*>(a), n,
         al->name.c_str(), reinterpret_cast<void*>(al->begin), reinterpret_cast<void*>(al->end),
         static_cast<long long>(a) - static_cast<long long>(al->begin));
  }
  record_global(*al, a, n, write ? GAccess::kWrite : GAccess::kRead, what);
}

// ---- warp collectives ------------------------------------------------------------------------------
void compute_warp_op(WarpOp& w, Block& b, int warp);

// Deposit this lane's registers; the last lane to arrive computes every lane's results.
void warp_collective(const Instr& ins, uintptr_t site, Regs& regs) {
  Fiber* f = g.cur;
  Block& b = *f->blk;
  const int warp = warp_of(f), lane = lane_of(f);
  WarpOp& w = b.warps[warp];
  for (int l = 0; l < kWarpSize; ++l) {
    if (b.fibers[warp * kWarpSize + l].state == State::kDone) {
      fail("warp-wide instruction '%s' with lane %d of the warp already exited", ins.text.c_str(), l);
    }
  }
  if (w.arrived == 0) {
    w.ins = &ins;
    w.site = site;
  } else if (w.ins->op != ins.op) {
    fail("lanes of warp %d diverge: this lane runs '%s' while others wait in '%s'", warp, ins.text.c_str(),
         w.ins->text.c_str());
  } else if (w.site != site || w.ins != &ins) {
    fail("lanes of warp %d reach warp-wide instruction '%s' from different call sites (%p and %p): the .aligned "
         "form needs every lane at the same instruction",
         warp, ins.text.c_str(), reinterpret_cast<void*>(site), reinterpret_cast<void*>(w.site));
  }
  copy_regs(w.lanes[lane], regs);
  ++g.collectives;
  if (++w.arrived < kWarpSize) {
    block_here(State::kWaitWarp);
  } else {
    compute_warp_op(w, b, warp);
    w.arrived = 0;
    for (int l = 0; l < kWarpSize; ++l) {
      Fiber& o = b.fibers[warp * kWarpSize + l];
      if (&o != f && o.state == State::kWaitWarp) make_ready(&o);
    }
    yield();
  }
  copy_regs(regs, w.lanes[lane]);
}

inline float elem(uint32_t r, int e, Ty ty) {
  const uint16_t h = static_cast<uint16_t>(e ? r >> 16 : r & 0xffffu);
  return ty == Ty::kBF16 ? bf16_to_float(h) : half_to_float(h);
}

inline void set_reg(Regs& r, const Ref& ref, uint64_t v) {
  if (ref.kind == RefKind::kOperand) {
    r.op[ref.v] = v;
  } else if (ref.kind == RefKind::kLocal) {
    r.local[ref.v] = v;
  } else {
    fail("PTX: an immediate as a destination");
  }
}

void compute_warp_op(WarpOp& w, Block& b, int warp) {
  const Instr& ins = *w.ins;
  if (ins.op == Op::kShfl) {
    // shfl.sync d, a, b, c, membermask (PTX ISA): c packs the clamp (bits 0-4) and the segment mask
    // (bits 8-12); a source lane outside [minLane, maxLane] reads the lane's own value.
    uint32_t src_val[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) src_val[l] = static_cast<uint32_t>(get(w.lanes[l], ins.args[1].regs[0]));
    for (int l = 0; l < kWarpSize; ++l) {
      const Regs& r = w.lanes[l];
      const uint32_t bval = static_cast<uint32_t>(get(r, ins.args[2].regs[0])) & 31u;
      const uint32_t c = static_cast<uint32_t>(get(r, ins.args[3].regs[0]));
      const uint32_t member = static_cast<uint32_t>(get(r, ins.args[4].regs[0]));
      if (!(member >> l & 1u)) {
        Fiber* saved = g.cur;
        g.cur = &b.fibers[warp * kWarpSize + l];
        fail("'%s': lane %d executes it with membermask 0x%08x, which does not hold it", ins.text.c_str(), l, member);
        g.cur = saved;
        return;
      }
      const uint32_t cval = c & 31u, segmask = (c >> 8) & 31u;
      const uint32_t max_lane = (static_cast<uint32_t>(l) & segmask) | (cval & ~segmask);
      const uint32_t min_lane = static_cast<uint32_t>(l) & segmask;
      int64_t j = l;
      bool pval = false;
      switch (ins.shfl_mode) {
        case 'u':
          j = static_cast<int64_t>(l) - bval;
          pval = j >= static_cast<int64_t>(max_lane);
          break;
        case 'd':
          j = static_cast<int64_t>(l) + bval;
          pval = j <= static_cast<int64_t>(max_lane);
          break;
        case 'b':
          j = l ^ static_cast<int64_t>(bval);
          pval = j <= static_cast<int64_t>(max_lane);
          break;
        default:
          j = min_lane | (bval & ~segmask);
          pval = j <= static_cast<int64_t>(max_lane);
          break;
      }
      if (!pval) j = l;
      if (!(member >> j & 1u)) {
        Fiber* saved = g.cur;
        g.cur = &b.fibers[warp * kWarpSize + l];
        fail("'%s': lane %d reads lane %lld, which membermask 0x%08x leaves out", ins.text.c_str(), l,
             static_cast<long long>(j), member);
        g.cur = saved;
        return;
      }
      set_reg(w.lanes[l], ins.args[0].regs[0], src_val[j]);
    }
    return;
  }
  if (ins.op == Op::kLdmatrix) {
    // ldmatrix.m8n8.b16: matrix i's 8 row addresses come from lanes 8i..8i+7. Without .trans, lane l's
    // register i holds row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i (lower column in the low
    // half); with .trans it holds column l/4, rows 2(l%4) and 2(l%4)+1.
    const int mats = ins.count;
    uint32_t addr[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) {
      addr[l] = static_cast<uint32_t>(get(w.lanes[l], ins.args[1].regs[0]) + ins.args[1].offset);
    }
    AccessGroup grp;
    grp.kind = kAccLdmatrix;
    grp.bytes = 16;
    grp.lanes = mats == 4 ? 0xffffffffu : (1u << (8 * mats)) - 1u;
    for (int l = 0; l < 8 * mats; ++l) grp.addr[l] = addr[l];
    count_wavefronts(grp);
    for (int l = 0; l < 8 * mats; ++l) {
      Fiber* saved = g.cur;
      g.cur = &b.fibers[warp * kWarpSize + l];
      smem_check_read(addr[l], 16, 16, ins.trans ? "ldmatrix.trans" : "ldmatrix");
      g.cur = saved;
    }
    for (int l = 0; l < kWarpSize; ++l) {
      for (int i = 0; i < mats; ++i) {
        uint16_t v[2];
        for (int e = 0; e < 2; ++e) {
          const int r = ins.trans ? 2 * (l % 4) + e : l / 4;
          const int c = ins.trans ? l / 4 : 2 * (l % 4) + e;
          memcpy(&v[e], b.smem + addr[8 * i + r] + 2 * c, 2);
        }
        set_reg(w.lanes[l], ins.args[0].regs[i], static_cast<uint32_t>(v[0]) | (static_cast<uint32_t>(v[1]) << 16));
      }
    }
    return;
  }
  if (ins.op == Op::kMma) {
    // mma.m16n8k16.row.col, g = lane/4, t = lane%4 (PTX ISA fragment layouts):
    //   A: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
    //   B: b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
    //   C, D: c0, c1 (g, 2t, 2t+1), c2, c3 (g+8, 2t, 2t+1)
    // m16n8k8: A a0, a1 and B b0 as above over k 0..7. Products of 16-bit inputs are exact in double;
    // the sum of one instruction is rounded to fp32 once.
    const int kk = ins.k;
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < kWarpSize; ++l) {
      const int gr = l / 4, t = l % 4;
      const Regs& r = w.lanes[l];
      auto reg = [&](int arg, int i) { return static_cast<uint32_t>(get(r, ins.args[arg].regs[i])); };
      for (int e = 0; e < 2; ++e) {
        A[gr][2 * t + e] = elem(reg(1, 0), e, ins.src);
        A[gr + 8][2 * t + e] = elem(reg(1, 1), e, ins.src);
        B[2 * t + e][gr] = elem(reg(2, 0), e, ins.src);
        if (kk == 16) {
          A[gr][2 * t + 8 + e] = elem(reg(1, 2), e, ins.src);
          A[gr + 8][2 * t + 8 + e] = elem(reg(1, 3), e, ins.src);
          B[2 * t + 8 + e][gr] = elem(reg(2, 1), e, ins.src);
        }
        C[gr][2 * t + e] = bits_f(reg(3, e));
        C[gr + 8][2 * t + e] = bits_f(reg(3, 2 + e));
      }
    }
    float D[16][8];
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        double acc = C[m][n];
        for (int k = 0; k < kk; ++k) acc += static_cast<double>(A[m][k]) * B[k][n];
        D[m][n] = static_cast<float>(acc);
      }
    }
    for (int l = 0; l < kWarpSize; ++l) {
      const int gr = l / 4, t = l % 4;
      set_reg(w.lanes[l], ins.args[0].regs[0], f_bits(D[gr][2 * t]));
      set_reg(w.lanes[l], ins.args[0].regs[1], f_bits(D[gr][2 * t + 1]));
      set_reg(w.lanes[l], ins.args[0].regs[2], f_bits(D[gr + 8][2 * t]));
      set_reg(w.lanes[l], ins.args[0].regs[3], f_bits(D[gr + 8][2 * t + 1]));
    }
    return;
  }
  if (ins.op == Op::kElect) {
    // elect.sync d|p, membermask: the leader is the lowest lane of membermask; d its lane number in every
    // lane, p true in the leader only. Every lane executes it (the .sync rule), with one membermask.
    const uint32_t mask = static_cast<uint32_t>(get(w.lanes[0], ins.args[2].regs[0]));
    for (int l = 0; l < kWarpSize; ++l) {
      if (static_cast<uint32_t>(get(w.lanes[l], ins.args[2].regs[0])) != mask || !(mask >> l & 1u)) {
        fail("'%s': lane %d's membermask 0x%08x is not the warp's full, common mask 0x%08x", ins.text.c_str(), l,
             static_cast<uint32_t>(get(w.lanes[l], ins.args[2].regs[0])), mask);
      }
    }
    const int leader = __builtin_ctz(mask);
    for (int l = 0; l < kWarpSize; ++l) {
      set_reg(w.lanes[l], ins.args[0].regs[0], static_cast<uint64_t>(leader));
      set_reg(w.lanes[l], ins.args[1].regs[0], l == leader ? 1 : 0);
    }
    return;
  }
  fail("internal: '%s' is not a warp-wide instruction", ins.text.c_str());
}

// ---- sm_90a: warpgroups, wgmma, mbarrier, TMA, setmaxnreg --------------------------------------------
constexpr int kWarpgroup = 128;
constexpr uint32_t kPoison = 0x7fc0dead;  // what an accumulator register holds until its wgmma retires

inline int warpgroup_of(const Fiber* f) { return f->index / kWarpgroup; }

void compute_wg_op(Warpgroup& w, Block& b, int wg);

// A .sync.aligned warpgroup instruction: all 128 threads of the warpgroup (4 whole warps) reach it from one
// call site; the last to arrive computes every thread's results.
void warpgroup_collective(const Instr& ins, uintptr_t site, Regs& regs) {
  Fiber* f = g.cur;
  Block& b = *f->blk;
  const int wg = warpgroup_of(f), me = f->index % kWarpgroup;
  if ((wg + 1) * kWarpgroup > g.threads) {
    fail("'%s' by a partial warpgroup: the block's %d threads leave warpgroup %d only %d of its 128 (4 whole warps)",
         ins.text.c_str(), g.threads, wg, g.threads - wg * kWarpgroup);
  }
  Warpgroup& w = b.wgs[static_cast<size_t>(wg)];
  for (int t = 0; t < kWarpgroup; ++t) {
    if (b.fibers[wg * kWarpgroup + t].state == State::kDone) {
      fail("'%s' by a partial warpgroup: thread %d of warpgroup %d has exited", ins.text.c_str(),
           wg * kWarpgroup + t, wg);
    }
  }
  if (w.arrived == 0) {
    w.ins = &ins;
    w.site = site;
  } else if (w.ins->op != ins.op) {
    fail("threads of warpgroup %d diverge: this thread runs '%s' while others wait in '%s'", wg, ins.text.c_str(),
         w.ins->text.c_str());
  } else if (w.site != site || w.ins != &ins) {
    fail("threads of warpgroup %d reach '%s' from different call sites: the .aligned form needs every thread of the "
         "warpgroup at the same instruction",
         wg, ins.text.c_str());
  }
  copy_regs(w.lanes[static_cast<size_t>(me)], regs);
  ++g.collectives;
  if (++w.arrived < kWarpgroup) {
    block_here(State::kWaitWarpgroup);
  } else {
    compute_wg_op(w, b, wg);
    w.arrived = 0;
    for (int t = 0; t < kWarpgroup; ++t) {
      Fiber& o = b.fibers[wg * kWarpgroup + t];
      if (&o != f && o.state == State::kWaitWarpgroup) make_ready(&o);
    }
    yield();
  }
  copy_regs(regs, w.lanes[static_cast<size_t>(me)]);
}

// The shared-memory address of element (row, k) of a 16-bit wgmma operand (row: M of A, N of B) under
// its matrix descriptor; the canonical layouts are hopper.cuh's (PTX ISA "Shared Memory Matrix Layout").
uint32_t desc_address(uint64_t desc, int row, int k, bool mn_major, const Instr& ins) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fff) << 4;
  const uint32_t lbo = static_cast<uint32_t>(desc >> 16 & 0x3fff) << 4;
  const uint32_t sbo = static_cast<uint32_t>(desc >> 32 & 0x3fff) << 4;
  const uint32_t base_offset = static_cast<uint32_t>(desc >> 49 & 7);
  const int mode = static_cast<int>(desc >> 62);
  if (base_offset != 0) fail("'%s': a descriptor base offset (%u) is not emulated", ins.text.c_str(), base_offset);
  const uint32_t r = static_cast<uint32_t>(row), kk = static_cast<uint32_t>(k);
  if (mode == 0) {  // core matrices of 8 x 16 bytes
    return mn_major ? start + r / 8 * sbo + kk / 8 * lbo + kk % 8 * 16 + 2 * (r % 8)
                    : start + r / 8 * sbo + kk / 8 * lbo + r % 8 * 16 + 2 * (kk % 8);
  }
  const uint32_t width = mode == 1 ? 128 : mode == 2 ? 64 : 32, bits = mode == 1 ? 3 : mode == 2 ? 2 : 1;
  const uint32_t a = mn_major ? start + r / (width / 2) * lbo + kk / 8 * sbo + kk % 8 * width + 2 * (r % (width / 2))
                              : start + r / 8 * sbo + r % 8 * width + 2 * kk;
  return a ^ ((a >> 7 & ((1u << bits) - 1)) << 4);
}

// published_to for every thread of warpgroup `wg` (a wgmma's shared-memory operand).
inline bool published_to_wg(const Block& b, const Shadow& s, int wg) {
  for (int t = 0; t < kWarpgroup; ++t) {
    if (!published_to(b, s, b.fibers[static_cast<size_t>(wg * kWarpgroup + t)])) return false;
  }
  return true;
}

// One 16-bit element a wgmma reads from shared memory, with the read rules: inside the launch's shared
// memory, written, not by a thread outside the warpgroup since the last __syncthreads, not under a
// cp.async in flight; a TMA's bytes after every thread of the warpgroup saw its mbarrier phase complete.
uint16_t wg_read(Block& b, int wg, uint32_t addr, const char* what, std::vector<std::pair<uint32_t, uint32_t>>& tma) {
  check_smem_range(addr, 2, 2, what);
  for (uint32_t i = 0; i < 2; ++i) {
    const Shadow& s = b.shadow[addr + i];
    if (s.pending_tid >= 0) {
      fail("%s: reads shared byte %u before the cp.async of thread %d that writes it was waited for", what, addr + i,
           s.pending_tid);
    }
    if (s.w_epoch == kAsyncWritten) {
      see_phases(tma, static_cast<uint32_t>(s.tma_bar), s.tma_phase + 1);
    } else if (s.w_epoch < 0) {
      fail("%s: reads shared byte %u, which nothing has written", what, addr + i);
    } else if (s.w_epoch == b.epoch && s.w_tid / kWarpgroup != wg && !published_to_wg(b, s, wg)) {
      fail("%s: reads shared byte %u written by thread %d (another warpgroup) with no __syncthreads between (race); "
           "an mbarrier arrival after the write whose phase every thread of this warpgroup saw complete would order them",
           what, addr + i, s.w_tid);
    } else if (s.w_tid >= 0 && b.fibers[static_cast<size_t>(s.w_tid)].proxy_fences == s.w_fences) {
      fail("%s: reads shared byte %u, which thread %d wrote with a generic-proxy store and no fence.proxy.async since: "
           "the async proxy (wgmma, TMA) may not see the write",
           what, addr + i, s.w_tid);
    }
  }
  uint16_t v;
  memcpy(&v, b.smem + addr, 2);
  return v;
}

void compute_wgmma(Warpgroup& w, Block& b, int wg) {
  const Instr& ins = *w.ins;
  const int n = ins.n;
  const bool a_regs = ins.trans;  // the 7-operand form
  const Regs& r0 = w.lanes[0];
  auto val = [&](const Regs& r, int arg) { return get(r, ins.args[static_cast<size_t>(arg)].regs[0]); };
  const int arg_b = a_regs ? 2 : 2, arg_scale = 3;
  const int arg_ta = a_regs ? -1 : 6, arg_tb = a_regs ? 6 : 7;
  for (int t = 1; t < kWarpgroup; ++t) {  // the descriptors and immediates are the warpgroup's, not a thread's
    const Regs& r = w.lanes[static_cast<size_t>(t)];
    for (int arg = a_regs ? 2 : 1; arg < static_cast<int>(ins.args.size()); ++arg) {
      if (val(r, arg) != val(r0, arg)) {
        fail("'%s': operand %d differs between threads 0 and %d of warpgroup %d (0x%llx, 0x%llx): it must be "
             "warpgroup-uniform",
             ins.text.c_str(), arg, t, wg, static_cast<unsigned long long>(val(r0, arg)),
             static_cast<unsigned long long>(val(r, arg)));
      }
    }
  }
  const int64_t scale_a = static_cast<int64_t>(val(r0, 4)), scale_b = static_cast<int64_t>(val(r0, 5));
  const uint64_t trans_a = arg_ta < 0 ? 0 : val(r0, arg_ta), trans_b = val(r0, arg_tb);
  if ((scale_a != 1 && scale_a != -1) || (scale_b != 1 && scale_b != -1) || trans_a > 1 || trans_b > 1) {
    fail("'%s': imm-scale-a/b are 1 or -1 and imm-trans-a/b 0 or 1", ins.text.c_str());
  }
  const bool accumulate = val(r0, arg_scale) != 0;
  auto to_f = [&](uint16_t h) { return ins.src == Ty::kBF16 ? bf16_to_float(h) : half_to_float(h); };
  std::vector<std::pair<uint32_t, uint32_t>> tma;
  std::vector<uint32_t>& reads = w.open.reads;
  static thread_local std::vector<float> A, B;
  A.assign(64 * 16, 0.f);
  B.assign(static_cast<size_t>(16 * n), 0.f);
  if (a_regs) {
    for (int t = 0; t < kWarpgroup; ++t) {
      const int wp = t / 32, l = t % 32, gr = l / 4, q = l % 4;
      const Regs& r = w.lanes[static_cast<size_t>(t)];
      for (int i = 0; i < 4; ++i) {
        const uint32_t v = static_cast<uint32_t>(get(r, ins.args[1].regs[static_cast<size_t>(i)]));
        const int row = 16 * wp + gr + 8 * (i % 2), k = 2 * q + 8 * (i / 2);
        A[static_cast<size_t>(row * 16 + k)] = to_f(static_cast<uint16_t>(v & 0xffff));
        A[static_cast<size_t>(row * 16 + k + 1)] = to_f(static_cast<uint16_t>(v >> 16));
      }
    }
  } else {
    const uint64_t da = val(r0, 1);
    for (int m = 0; m < 64; ++m) {
      for (int k = 0; k < 16; ++k) {
        const uint32_t addr = desc_address(da, m, k, trans_a != 0, ins);
        A[static_cast<size_t>(m * 16 + k)] = to_f(wg_read(b, wg, addr, "wgmma (A from shared memory)", tma));
        reads.push_back(addr);
      }
    }
  }
  const uint64_t db = val(r0, arg_b);
  for (int nn = 0; nn < n; ++nn) {
    for (int k = 0; k < 16; ++k) {
      const uint32_t addr = desc_address(db, nn, k, trans_b != 0, ins);
      B[static_cast<size_t>(k * n + nn)] = to_f(wg_read(b, wg, addr, "wgmma (B from shared memory)", tma));
      reads.push_back(addr);
    }
  }
  for (const auto& need : tma) {  // every thread of the warpgroup saw the phases its TMA bytes landed in
    for (int t = 0; t < kWarpgroup; ++t) {
      const Fiber& o = b.fibers[wg * kWarpgroup + t];
      if (seen_phases(&o, need.first) < need.second) {
        fail("'%s' reads shared memory a TMA writes on the mbarrier at %u in its phase %u before thread %d of "
             "warpgroup %d waited for that phase to complete (race)",
             ins.text.c_str(), need.first, need.second - 1, o.index, wg);
      }
    }
  }
  for (size_t i = reads.size() - (a_regs ? 0 : 64 * 16) - static_cast<size_t>(16 * n); i < reads.size(); ++i) {
    ++b.shadow[reads[i]].async_reads;
    ++b.shadow[reads[i] + 1].async_reads;
  }
  const double sign = static_cast<double>(scale_a * scale_b);
  for (int t = 0; t < kWarpgroup; ++t) {
    Fiber& o = b.fibers[wg * kWarpgroup + t];
    Regs& r = w.lanes[static_cast<size_t>(t)];
    const int wp = t / 32, l = t % 32, gr = l / 4, q = l % 4;
    for (int i = 0; i < n / 2; ++i) {
      const int row = 16 * wp + gr + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * q + (i % 2);
      const Ref& ref = ins.args[0].regs[static_cast<size_t>(i)];
      double acc = accumulate ? bits_f(static_cast<uint32_t>(get(r, ref))) : 0.0;
      for (int k = 0; k < 16; ++k) {
        acc += sign * static_cast<double>(A[static_cast<size_t>(row * 16 + k)]) * B[static_cast<size_t>(k * n + col)];
      }
      if (ref.kind != RefKind::kOperand || static_cast<size_t>(ref.v) >= o.n_outs) {
        fail("'%s': accumulator %d is not an output operand of the asm statement", ins.text.c_str(), i);
      }
      const uintptr_t at = reinterpret_cast<uintptr_t>(o.outs[ref.v].ptr);
      o.pending[at] = PendingAcc{f_bits(static_cast<float>(acc)), w.open.number, &ins};
      o.pending_lo = std::min(o.pending_lo, at);
      o.pending_hi = std::max(o.pending_hi, at + 4);
      set_reg(r, ref, kPoison);
    }
  }
}

// wgmma.wait_group: retire the oldest groups until at most `keep` are pending; their accumulator registers
// take their values and the shared memory they read is free to write.
void retire_groups(Warpgroup& w, Block& b, int wg, size_t keep) {
  while (w.closed.size() > keep) {
    const WgGroup& grp = w.closed.front();
    for (uint32_t a : grp.reads) {
      --b.shadow[a].async_reads;
      --b.shadow[a + 1].async_reads;
    }
    for (int t = 0; t < kWarpgroup; ++t) {
      Fiber& o = b.fibers[wg * kWarpgroup + t];
      for (auto it = o.pending.begin(); it != o.pending.end();) {
        if (it->second.group == grp.number) {
          memcpy(reinterpret_cast<void*>(it->first), &it->second.value, 4);
          it = o.pending.erase(it);
        } else {
          ++it;
        }
      }
      if (o.pending.empty()) o.pending_lo = UINTPTR_MAX, o.pending_hi = 0;
    }
    w.closed.pop_front();
  }
}

inline int64_t block_registers(const Block& b) {
  int64_t sum = 0;
  for (const Warpgroup& x : b.wgs) sum += static_cast<int64_t>(x.regs) * kWarpgroup;
  return sum;
}

void compute_wg_op(Warpgroup& w, Block& b, int wg) {
  const Instr& ins = *w.ins;
  switch (ins.op) {
    case Op::kWgFence:
      return;
    case Op::kWgCommit:
      w.closed.push_back(std::move(w.open));
      w.open = WgGroup{w.closed.back().number + 1, {}};
      return;
    case Op::kWgWait: {
      const uint64_t keep = get(w.lanes[0], ins.args[0].regs[0]);
      retire_groups(w, b, wg, static_cast<size_t>(keep));
      return;
    }
    case Op::kWgmma:
      compute_wgmma(w, b, wg);
      return;
    case Op::kSetmaxnreg: {
      // the count is an immediate: one call site (the .aligned rule) means one count for the warpgroup
      const int want = static_cast<int>(get(w.lanes[0], ins.args[0].regs[0]));
      if (want < 24 || want > 256 || want % 8 != 0) fail("'%s': %d registers (24 to 256, a multiple of 8)", ins.text.c_str(), want);
      const bool inc = ins.expect_tx;
      if (inc ? want < w.regs : want > w.regs) {
        fail("'%s': warpgroup %d holds %d registers per thread; .%s to %d goes the other way", ins.text.c_str(), wg,
             w.regs, inc ? "inc" : "dec", want);
      }
      const int before = w.regs;
      w.regs = want;
      if (inc) {  // waits until the block's pool has them (another warpgroup's .dec)
        while (block_registers(b) > kRegistersPerBlock) {
          w.regs = before;
          g.cur->wait_bar = static_cast<uint32_t>(want);
          block_here(State::kWaitRegs);
          w.regs = want;
        }
      } else {
        for (Fiber& o : b.fibers) {
          if (o.state == State::kWaitRegs) make_ready(&o);
        }
      }
      return;
    }
    default:
      fail("internal: '%s' is not a warpgroup instruction", ins.text.c_str());
  }
}

Mbar& find_mbar(uint32_t addr, const char* what) {
  check_smem_range(addr, 8, 8, what);
  Block& b = *g.cur->blk;
  auto it = b.mbars.find(addr);
  if (it == b.mbars.end()) fail("%s: shared address %u holds no mbarrier (mbarrier.init it first)", what, addr);
  return it->second;
}

// A phase completes when its arrivals and its transaction bytes are all in; the next begins.
void mbar_progress(Mbar& m, uint32_t addr) {
  if (m.pending != 0 || m.tx != 0) return;
  std::vector<std::pair<uint32_t, uint32_t>> learned;
  const auto before = m.released.find(m.phase);
  if (before != m.released.end()) learned = before->second;
  for (const auto& e : m.arriving) see_phases(learned, e.first, e.second);
  m.arriving.clear();
  ++m.phase;
  m.released[m.phase] = std::move(learned);
  m.pending = m.count;
  for (Fiber& o : g.cur->blk->fibers) {
    if (o.state == State::kWaitMbar && o.wait_bar == addr) make_ready(&o);
  }
}

void mbar_complete_tx(Mbar& m, uint32_t addr, uint32_t bytes, const char* what) {
  m.tx -= bytes;
  if (m.tx < 0) {
    fail("%s: completes %u bytes on the mbarrier at %u, whose phase %u expects only %lld: an "
         "mbarrier.expect_tx (arrive.expect_tx) for these bytes is missing or too small",
         what, bytes, addr, m.phase, static_cast<long long>(m.tx + bytes));
  }
  mbar_progress(m, addr);
}

// The emulator's tensor map, inside the driver's opaque 128 bytes (emu_tensor_map_encode_tiled makes it).
constexpr uint32_t kTensorMapMagic = 0x544d4150;  // "TMAP"
struct TensorMap {
  uint32_t magic;
  uint8_t dtype, rank, elem_bytes, swizzle, interleave, oob_fill, l2, pad;
  uint64_t address;
  uint32_t dim[5];
  uint32_t pad2;
  uint64_t stride[4];  // bytes, dims 1..rank-1
  uint32_t box[5];
  uint8_t elem_stride[5];
};
static_assert(sizeof(TensorMap) <= 128, "the tensor map lives in CUtensorMap's 128 bytes");

const TensorMap& tensor_map_at(uintptr_t p, const Instr& ins) {
  if (p == 0 || p % 64 != 0) fail("'%s': tensor map address %p is not 64-byte aligned", ins.text.c_str(), reinterpret_cast<void*>(p));
  const TensorMap& m = *reinterpret_cast<const TensorMap*>(p);
  if (m.magic != kTensorMapMagic) {
    fail("'%s': the 128 bytes at %p are not a tensor map cuTensorMapEncodeTiled made (the emulator's encoder: "
         "emu_tensor_map_encode_tiled)",
         ins.text.c_str(), reinterpret_cast<void*>(p));
  }
  return m;
}

// cp.async.bulk.tensor: the box at `coords` into shared memory at `dst` (rows of box[0] elements, outer
// dimensions in order, the swizzle pattern on the address bits), out-of-bounds elements zero; then its
// bytes complete on the mbarrier.
void tma_load(const Instr& ins, uint32_t dst, const TensorMap& m, const int32_t* coords, uint32_t bar) {
  Block& b = *g.cur->blk;
  const char* what = "cp.async.bulk.tensor";
  if (static_cast<int>(m.rank) != ins.n) fail("'%s': a %dd copy of a rank-%d tensor map", ins.text.c_str(), ins.n, m.rank);
  Mbar& mb = find_mbar(bar, what);
  const uint32_t row_bytes = m.box[0] * m.elem_bytes;
  uint32_t rows = 1;
  for (int d = 1; d < m.rank; ++d) rows *= m.box[d];
  const uint32_t bytes = rows * row_bytes;
  check_smem_range(dst, bytes, 128, "cp.async.bulk.tensor destination");
  const uint32_t bits = m.swizzle == 3 ? 3 : m.swizzle == 2 ? 2 : m.swizzle == 1 ? 1 : 0;
  std::vector<unsigned char> row(row_bytes);
  for (uint32_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    bool inside = true;
    uint32_t rest = r;
    for (int d = 1; d < m.rank; ++d) {
      const int64_t c = static_cast<int64_t>(coords[d]) + rest % m.box[d];
      rest /= m.box[d];
      inside &= c >= 0 && c < static_cast<int64_t>(m.dim[d]);
      off += c * static_cast<int64_t>(m.stride[d - 1]);
    }
    std::fill(row.begin(), row.end(), 0);
    if (inside) {
      const int64_t x0 = std::max<int64_t>(coords[0], 0);
      const int64_t x1 = std::min<int64_t>(static_cast<int64_t>(coords[0]) + m.box[0], m.dim[0]);
      if (x1 > x0) {
        const uintptr_t src = static_cast<uintptr_t>(static_cast<int64_t>(m.address) + off + x0 * m.elem_bytes);
        const size_t len = static_cast<size_t>(x1 - x0) * m.elem_bytes;
        check_global(src, len, 1, GAccess::kRead, "cp.async.bulk.tensor source");
        memcpy(row.data() + (x0 - coords[0]) * m.elem_bytes, reinterpret_cast<const void*>(src), len);
      }
    }
    for (uint32_t c = 0; c < row_bytes; c += 16) {
      uint32_t a = dst + r * row_bytes + c;
      if (bits != 0) a ^= (a >> 7 & ((1u << bits) - 1)) << 4;
      for (uint32_t i = 0; i < 16 && c + i < row_bytes; ++i) {
        Shadow& s = b.shadow[a + i];
        if (s.pending_tid >= 0) fail("%s: writes shared byte %u while a cp.async of thread %d to it is in flight (race)", what, a + i, s.pending_tid);
        if (s.async_reads > 0) {
          fail("%s: writes shared byte %u, which a wgmma no wgmma.wait_group has retired still reads (race)", what, a + i);
        }
        s.w_epoch = kAsyncWritten;
        s.w_tid = -1;
        s.tma_bar = static_cast<int32_t>(bar);
        s.tma_phase = mb.phase;
        b.smem[a + i] = row[c + i];
      }
    }
  }
  mbar_complete_tx(mb, bar, bytes, what);
}

// At a barrier every waiting thread learns what the others saw of the mbarriers.
void join_observed(std::vector<Fiber*>& fibers) {
  std::vector<std::pair<uint32_t, uint32_t>> all;
  for (Fiber* o : fibers) {
    for (const auto& e : o->observed) see_phases(all, e.first, e.second);
  }
  for (Fiber* o : fibers) o->observed = all;
}

void named_barrier(uint32_t id, uint32_t threads, bool wait, const Instr& ins) {
  Fiber* f = g.cur;
  Block& b = *f->blk;
  if (id > 15 || threads == 0 || threads % kWarpSize != 0 || threads > static_cast<uint32_t>(g.threads)) {
    fail("'%s': barrier %u for %u threads (ids 0-15, a positive multiple of 32 up to the block's %d)", ins.text.c_str(),
         id, threads, g.threads);
  }
  NamedBarrier& nb = b.named[id];
  if (nb.arrived == 0) {
    nb.expected = static_cast<int>(threads);
  } else if (nb.expected != static_cast<int>(threads)) {
    fail("'%s': barrier %u counts %u threads here and %d elsewhere", ins.text.c_str(), id, threads, nb.expected);
  }
  for (const auto& e : f->observed) see_phases(nb.seen, e.first, e.second);
  if (++nb.arrived == nb.expected) {
    for (Fiber& o : b.fibers) {
      if (o.state == State::kWaitNamed && o.wait_bar == id) {
        for (const auto& e : nb.seen) see_phases(o.observed, e.first, e.second);
        make_ready(&o);
      }
    }
    for (const auto& e : nb.seen) see_phases(f->observed, e.first, e.second);
    nb = NamedBarrier{};
    yield();
    return;
  }
  if (wait) {
    f->wait_bar = id;
    block_here(State::kWaitNamed);
  }
}

// What an sm_90 instruction does for the calling thread.
void exec_sm90(const Instr& in, Regs& r, uintptr_t site) {
  Fiber* f = g.cur;
  auto src = [&](int i) { return get(r, in.args[static_cast<size_t>(i)].regs[0]); };
  auto addr = [&](int i) {
    return static_cast<uint32_t>(get(r, in.args[static_cast<size_t>(i)].regs[0]) + in.args[static_cast<size_t>(i)].offset);
  };
  switch (in.op) {
    case Op::kSetp: {
      const bool eq = (src(1) & 0xffffffffu) == (src(2) & 0xffffffffu);
      set_reg(r, in.args[0].regs[0], (in.trans ? eq : !eq) ? 1 : 0);
      return;
    }
    case Op::kSelp:
      set_reg(r, in.args[0].regs[0], src(3) ? src(1) : src(2));
      return;
    case Op::kElect:
      warp_collective(in, site, r);
      return;
    case Op::kWgFence:
      f->wg_fenced = true;
      f->dirty.clear();
      warpgroup_collective(in, site, r);
      return;
    case Op::kWgCommit:
    case Op::kWgWait:
    case Op::kSetmaxnreg:
      warpgroup_collective(in, site, r);
      return;
    case Op::kWgmma: {
      if (!f->wg_fenced) {
        fail("'%s' before any wgmma.fence of its thread: a wgmma.fence must come before the first wgmma",
             in.text.c_str());
      }
      for (const Ref& ref : in.args[0].regs) {
        const uintptr_t at = reinterpret_cast<uintptr_t>(f->outs[ref.v].ptr);
        if (f->dirty.count(at) != 0) {
          fail("'%s': accumulator register %lld (at %p) was written by an ordinary instruction after the last "
               "wgmma.fence: a wgmma.fence must order that write before the wgmma",
               in.text.c_str(), static_cast<long long>(ref.v), reinterpret_cast<void*>(at));
        }
      }
      warpgroup_collective(in, site, r);
      return;
    }
    case Op::kMbarInit: {
      const uint32_t a = addr(0);
      const uint64_t count = src(1);
      check_smem_range(a, 8, 8, "mbarrier.init");
      if (count == 0 || count >= (1u << 20)) fail("'%s': arrival count %llu (1 to 2^20 - 1)", in.text.c_str(), static_cast<unsigned long long>(count));
      Block& b = *f->blk;
      b.mbars[a] = Mbar{static_cast<uint32_t>(count), static_cast<uint32_t>(count), 0, 0};
      return;
    }
    case Op::kMbarArrive: {
      const uint32_t a = addr(1);
      Mbar& m = find_mbar(a, in.opcode.c_str());
      if (in.expect_tx) m.tx += static_cast<int64_t>(src(2) & 0xffffffffu);
      if (m.pending == 0) {
        fail("'%s': an arrival beyond the count: the mbarrier at %u expects %u arrivals per phase and phase %u has them "
             "all (it waits for %lld transaction bytes)",
             in.text.c_str(), a, m.count, m.phase, static_cast<long long>(m.tx));
      }
      for (const auto& e : f->observed) see_phases(m.arriving, e.first, e.second);
      f->releases.push_back(Fiber::Release{a, m.phase + 1, f->smem_writes});
      --m.pending;
      mbar_progress(m, a);
      return;
    }
    case Op::kMbarExpectTx: {
      const uint32_t a = addr(0);
      Mbar& m = find_mbar(a, in.opcode.c_str());
      m.tx += static_cast<int64_t>(src(1) & 0xffffffffu);
      return;
    }
    case Op::kMbarTryWait: {
      const uint32_t a = addr(1);
      const uint32_t parity = static_cast<uint32_t>(src(2) & 1);
      for (;;) {
        Mbar& m = find_mbar(a, in.opcode.c_str());
        if ((m.phase & 1) != parity) {  // the last phase of this parity has completed
          const uint32_t seen = ((m.phase - 1) & 1) == parity ? m.phase : m.phase - 1;
          for (auto& e : f->observed) {
            if (e.first == a) {
              e.second = std::max(e.second, seen);
              break;
            }
          }
          if (seen_phases(f, a) < seen) f->observed.emplace_back(a, seen);
          const auto learned = m.released.find(seen);  // what the arrivals of that phase had seen
          if (learned != m.released.end()) {
            for (const auto& e : learned->second) see_phases(f->observed, e.first, e.second);
          }
          set_reg(r, in.args[0].regs[0], 1);
          return;
        }
        f->wait_bar = a;
        f->wait_parity = parity;
        block_here(State::kWaitMbar);
      }
    }
    case Op::kFence:
      if (in.trans) ++f->proxy_fences;  // fence.proxy.async
      return;
    case Op::kPrefetchTmap:
      tensor_map_at(src(0), in);
      return;
    case Op::kBarSync:
    case Op::kBarArrive:
      named_barrier(static_cast<uint32_t>(src(0)), static_cast<uint32_t>(src(1)), in.op == Op::kBarSync, in);
      return;
    case Op::kTma: {
      const Arg& m = in.args[1];
      const TensorMap& map = tensor_map_at(get(r, m.regs[0]) + m.offset, in);
      int32_t coords[5];
      for (int d = 0; d < in.n; ++d) coords[d] = static_cast<int32_t>(get(r, m.regs[static_cast<size_t>(d) + 1]));
      tma_load(in, addr(0), map, coords, addr(2));
      return;
    }
    default:
      fail("internal: '%s' has no sm_90 execution", in.text.c_str());
  }
}

// ---- executing one asm statement --------------------------------------------------------------------
constexpr double kTanhMaxRelError = 0.00049270099;  // 2^-10.987 (the .f32 bound is 2^-11 = 0.00048828)

float tanh_approx(float x) {
  if (g_tanh_exact) return std::tanh(x);
  uint32_t h = f_bits(x) * 0x9E3779B1u;  // a fixed hash of the input picks the error
  h ^= h >> 15;
  const double r = static_cast<double>(h & 0xffffu) / 32767.5 - 1.0;  // in [-1, 1]
  const double y = std::tanh(static_cast<double>(x)) * (1.0 + r * kTanhMaxRelError);
  return static_cast<float>(std::fmax(-1.0, std::fmin(1.0, y)));
}

inline uint16_t narrow(float f, Ty ty, bool rz) { return ty == Ty::kBF16 ? float_to_bf16(f, rz) : float_to_half(f, rz); }

void wait_groups(Fiber* f, size_t keep) {
  Block& b = *f->blk;
  while (f->committed.size() > keep) {
    const uint32_t seq = ++f->smem_writes;
    for (const CopyOp& op : f->committed.front()) {
      unsigned char data[16] = {0};
      if (op.src_bytes > 0) memcpy(data, op.src, static_cast<size_t>(op.src_bytes));
      memcpy(b.smem + op.dst, data, static_cast<size_t>(op.bytes));
      for (int i = 0; i < op.bytes; ++i) {
        Shadow& s = b.shadow[op.dst + i];
        s.pending_tid = -1;
        s.w_epoch = b.epoch;
        s.w_tid = static_cast<int16_t>(f->index);
        s.w_fences = f->proxy_fences;
        s.w_seq = seq;
      }
    }
    f->committed.pop_front();
  }
}

void exec(const Instr& in, Regs& r, uintptr_t site) {
  Fiber* f = g.cur;
  auto src = [&](int i) { return get(r, in.args[i].regs[0]); };
  auto dst = [&](int i, uint64_t v) { set_reg(r, in.args[i].regs[0], v); };
  switch (in.op) {
    case Op::kMov:
      dst(0, src(1) & 0xffffffffu);
      return;
    case Op::kCvta: {
      const uintptr_t a = src(1), base = reinterpret_cast<uintptr_t>(f->blk->smem);
      if (a < base || a > base + kMaxSmem) fail("'%s': %p is not a pointer into this block's shared memory", in.text.c_str(), reinterpret_cast<void*>(a));
      dst(0, a - base);
      return;
    }
    case Op::kCvt: {
      if (in.dst == Ty::kU32) {
        dst(0, src(1) & 0xffffffffu);
      } else if (in.dst == Ty::kF32) {
        dst(0, f_bits(half_to_float(static_cast<uint16_t>(src(1)))));
      } else if (in.x2pack) {  // the first source goes to the upper half (PTX ISA, cvt)
        const uint32_t hi = narrow(bits_f(static_cast<uint32_t>(src(1))), in.dst, in.rz);
        const uint32_t lo = narrow(bits_f(static_cast<uint32_t>(src(2))), in.dst, in.rz);
        dst(0, lo | hi << 16);
      } else {
        dst(0, narrow(bits_f(static_cast<uint32_t>(src(1))), in.dst, in.rz));
      }
      return;
    }
    case Op::kEx2:
    case Op::kLg2:
    case Op::kRcp:
    case Op::kTanh: {
      float x = bits_f(static_cast<uint32_t>(src(1)));
      if (in.ftz) x = ftz(x);
      float y = in.op == Op::kEx2 ? std::exp2(x) : in.op == Op::kLg2 ? std::log2(x) : in.op == Op::kRcp ? 1.f / x : tanh_approx(x);
      if (in.ftz) y = ftz(y);
      dst(0, f_bits(y));
      return;
    }
    case Op::kShfl:
    case Op::kLdmatrix:
    case Op::kMma:
      warp_collective(in, site, r);
      return;
    case Op::kCpAsync: {
      const uint32_t d = static_cast<uint32_t>(get(r, in.args[0].regs[0]) + in.args[0].offset);
      const uintptr_t s = get(r, in.args[1].regs[0]) + in.args[1].offset;
      const int64_t src_bytes = in.args.size() == 4 ? static_cast<int64_t>(src(3)) : in.bytes;
      if (src_bytes < 0 || src_bytes > in.bytes) {
        fail("'%s': src-size %lld is not within the cp-size %d", in.text.c_str(), static_cast<long long>(src_bytes), in.bytes);
      }
      record_access(kAccCpAsync, d, static_cast<uint32_t>(in.bytes), site);
      if (src_bytes > 0) check_global(s, static_cast<size_t>(src_bytes), static_cast<size_t>(in.bytes), GAccess::kRead, "cp.async source");
      check_smem_range(d, static_cast<uint32_t>(in.bytes), static_cast<uint32_t>(in.bytes), "cp.async destination");
      const int16_t me = static_cast<int16_t>(f->index);
      smem_claim(d, static_cast<uint32_t>(in.bytes), me, "cp.async");
      for (int i = 0; i < in.bytes; ++i) f->blk->shadow[d + i].pending_tid = me;
      f->open_group.push_back(CopyOp{d, reinterpret_cast<const void*>(s), in.bytes, static_cast<int>(src_bytes)});
      return;
    }
    case Op::kCommit:
      f->committed.push_back(std::move(f->open_group));
      f->open_group.clear();
      return;
    case Op::kWaitGroup:
      wait_groups(f, static_cast<size_t>(src(0)));
      return;
    case Op::kWaitAll:
      f->committed.push_back(std::move(f->open_group));
      f->open_group.clear();
      wait_groups(f, 0);
      return;
    case Op::kLd:
    case Op::kSt: {
      const bool load = in.op == Op::kLd;
      const Arg& a = in.args[load ? 1 : 0];
      const Arg& data = in.args[load ? 0 : 1];
      const uint32_t n = static_cast<uint32_t>(in.bytes * in.count);
      unsigned char buf[64];
      if (!load) {
        for (int i = 0; i < in.count; ++i) {
          const uint64_t v = get(r, data.regs[i]);
          memcpy(buf + i * in.bytes, &v, static_cast<size_t>(in.bytes));
        }
      }
      const char* what = in.opcode.c_str();
      if (in.shared) {
        const uint32_t addr = static_cast<uint32_t>(get(r, a.regs[0]) + a.offset);
        record_access(load ? kAccLd : kAccSt, addr, n, site);
        if (load) {
          smem_read(addr, buf, n, n, what);
        } else {
          smem_write(addr, buf, n, n, what);
        }
      } else {
        const uintptr_t addr = get(r, a.regs[0]) + a.offset;
        check_global(addr, n, n, load ? GAccess::kRead : GAccess::kWrite, what);
        if (load) {
          memcpy(buf, reinterpret_cast<const void*>(addr), n);
        } else {
          memcpy(reinterpret_cast<void*>(addr), buf, n);
        }
      }
      if (load) {
        for (int i = 0; i < in.count; ++i) {
          uint64_t v = 0;
          memcpy(&v, buf + i * in.bytes, static_cast<size_t>(in.bytes));
          set_reg(r, data.regs[i], v);
        }
      }
      return;
    }
    default:
      exec_sm90(in, r, site);
      return;
    case Op::kRed: {
      const uintptr_t addr = get(r, in.args[0].regs[0]) + in.args[0].offset;
      check_global(addr, 4u * in.count, 4u * in.count, GAccess::kAtomic, in.count > 1 ? "red.global.add.v2.f32" : "red.global.add.f32");
      float* p = reinterpret_cast<float*>(addr);
      // atom/red .add.f32: round to nearest even, subnormal inputs and results flushed to zero (PTX ISA)
      for (int i = 0; i < in.count; ++i) p[i] = ftz(ftz(p[i]) + ftz(bits_f(static_cast<uint32_t>(get(r, in.args[1].regs[i])))));
      return;
    }
  }
}

const Program& program_of(const char* text) {
  auto it = g.programs.find(text);
  if (it != g.programs.end()) return *it->second;
  auto prog = std::make_unique<Program>(parse_program(text));
  const Program& ref = *prog;
  g.programs.emplace(text, std::move(prog));
  return ref;
}

// ---- launching -------------------------------------------------------------------------------------------
typedef void (*KernelFn)(FaParams);

static KernelFn g_kernel = nullptr;
static FaParams g_params;
typedef void (*RawKernelFn)(const void*);  // a test kernel taking a pointer to its arguments
static RawKernelFn g_raw_kernel = nullptr;
static const void* g_raw_args = nullptr;
// An sm_90a kernel's parameters: the Params struct, then __grid_constant__ tensor maps (hopper.cuh's
// CUtensorMap: 128 bytes, 64-byte aligned), passed by value as the kernel declares them.
struct alignas(64) Map128 {
  uint64_t w[16];
};
typedef void (*Maps3KernelFn)(FaParams, Map128, Map128, Map128);
typedef void (*Maps4KernelFn)(FaParams, Map128, Map128, Map128, Map128);
static int g_n_maps = 0;
static Map128 g_maps[4];

inline void switch_to(Fiber* f) {
  g.cur = f;
  cur_tid = f->tid;
  cur_bid = f->blk->idx;
}

void fiber_main() {
  Fiber* f = g.cur;
  if (g_kernel != nullptr && g_n_maps == 3) {
    reinterpret_cast<Maps3KernelFn>(g_kernel)(g_params, g_maps[0], g_maps[1], g_maps[2]);
  } else if (g_kernel != nullptr && g_n_maps == 4) {
    reinterpret_cast<Maps4KernelFn>(g_kernel)(g_params, g_maps[0], g_maps[1], g_maps[2], g_maps[3]);
  } else if (g_kernel != nullptr) {
    g_kernel(g_params);
  } else {
    g_raw_kernel(g_raw_args);
  }
  f = g.cur;
  Block& b = *f->blk;
  if (b.barrier_arrived > 0) fail("thread exits while %d others wait at __syncthreads", b.barrier_arrived);
  if (!f->committed.empty() || !f->open_group.empty()) {
    fail("thread exits with cp.async copies no wait_group retired (%zu committed groups, %zu copies not "
         "committed)",
         f->committed.size(), f->open_group.size());
  }
  if (!f->pending.empty()) {
    fail("thread exits with %zu accumulator registers of '%s' that no wgmma.wait_group retired", f->pending.size(),
         f->pending.begin()->second.ins->text.c_str());
  }
  const int warp = warp_of(f);
  if (b.warps[warp].arrived > 0) {
    fail("thread exits while %d lanes of its warp wait in a warp-wide instruction", b.warps[warp].arrived);
  }
  f->state = State::kDone;
  --b.live;
  _longjmp(g.sched_jb, 1);  // never returns: the stack is reused
}

void start_block(Block& b, int64_t id) {
  b.id = id;
  b.idx = Dim3{static_cast<unsigned>(id % g.grid_dim.x), static_cast<unsigned>(id / g.grid_dim.x % g.grid_dim.y),
               static_cast<unsigned>(id / g.grid_dim.x / g.grid_dim.y)};
  b.barrier_arrived = 0;
  b.epoch = 0;
  b.live = g.threads;
  b.groups.clear();
  for (WarpOp& w : b.warps) w.arrived = 0;
  b.mbars.clear();
  for (NamedBarrier& nb : b.named) nb = NamedBarrier{};
  const int regs0 = g.limits.registers > 0 ? g.limits.registers : std::min(255, kRegistersPerBlock / g.threads) / 8 * 8;
  for (Warpgroup& w : b.wgs) {
    w.arrived = 0;
    w.open = WgGroup{};
    w.closed.clear();
    w.regs = regs0;
  }
  std::fill(b.shadow.begin(), b.shadow.end(), Shadow{});
  memset(b.smem, 0xff, static_cast<size_t>(g.smem_bytes));  // fp16/bf16 NaN: an unwritten element that slips through shows
  for (Fiber& f : b.fibers) {
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &g.sched;
    f.open_group.clear();
    f.committed.clear();
    f.site_count.clear();
    f.pending.clear();
    f.pending_lo = UINTPTR_MAX;
    f.pending_hi = 0;
    f.wg_fenced = false;
    f.dirty.clear();
    f.observed.clear();
    f.proxy_fences = 0;
    f.smem_writes = 0;
    f.releases.clear();
    f.started = false;
    makecontext(&f.ctx, fiber_main, 0);
    make_ready(&f);
  }
}

const char* state_name(State s) {
  switch (s) {
    case State::kWaitBlock:
      return "__syncthreads";
    case State::kWaitWarp:
      return "a warp-wide instruction";
    case State::kWaitWarpgroup:
      return "a warpgroup-wide instruction (wgmma, setmaxnreg: a partial warpgroup never completes it)";
    case State::kWaitNamed:
      return "a named barrier (bar.sync)";
    default:
      return "nothing";
  }
}

// Why a deadlocked thread waits, in words (the most telling waiter of the block first).
std::string wait_reason(const Block& b, const Fiber& f) {
  char msg[320];
  if (f.state == State::kWaitMbar) {
    const auto it = b.mbars.find(f.wait_bar);
    const Mbar m = it == b.mbars.end() ? Mbar{} : it->second;
    snprintf(msg, sizeof msg,
             "waits on the mbarrier at %u for parity %u, but its phase %u (parity %u) never completes: %u of %u "
             "arrivals and %lld transaction bytes missing (a wrong parity, a missing arrive or TMA)",
             f.wait_bar, f.wait_parity, m.phase, m.phase & 1, m.pending, m.count, static_cast<long long>(m.tx));
  } else if (f.state == State::kWaitRegs) {
    int64_t held = 0;
    for (const Warpgroup& w : b.wgs) held += static_cast<int64_t>(w.regs) * kWarpgroup;
    snprintf(msg, sizeof msg,
             "waits in setmaxnreg.inc to %u registers for warpgroup %d: the block's warpgroups hold %lld of 65536 "
             "and no setmaxnreg.dec gives any back",
             f.wait_bar, f.index / kWarpgroup, static_cast<long long>(held));
  } else {
    snprintf(msg, sizeof msg, "waits at %s", state_name(f.state));
  }
  return msg;
}

// Runs every block of the grid, `window` at a time, fibers picked in a seeded random order.
bool run_grid(int64_t blocks) {
  int64_t next = 0;
  const size_t slots = static_cast<size_t>(std::min<int64_t>(g.window, blocks));
  for (size_t s = 0; s < slots; ++s) start_block(*g.blocks[s], next++);
  g_hooks_on = true;
  while (!g.failed) {
    if (g.ready.empty()) {
      for (size_t s = 0; s < slots; ++s) {
        Block& b = *g.blocks[s];
        if (b.id < 0) continue;
        const Fiber* stuck = nullptr;
        for (const Fiber& f : b.fibers) {
          if (f.state == State::kDone) continue;
          const bool telling = f.state == State::kWaitRegs || f.state == State::kWaitMbar;
          if (stuck == nullptr || (telling && stuck->state != State::kWaitRegs)) stuck = &f;
        }
        if (stuck != nullptr) {
          g.cur = nullptr;
          char msg[480];
          snprintf(msg, sizeof msg, "deadlock: thread %d of block (%u, %u, %u) %s, and no thread can run",
                   stuck->index, b.idx.x, b.idx.y, b.idx.z, wait_reason(b, *stuck).c_str());
          fail("%s", msg);
        }
      }
      break;
    }
    const size_t pick = static_cast<size_t>(next_random() % g.ready.size());
    Fiber* f = g.ready[pick];
    g.ready[pick] = g.ready.back();
    g.ready.pop_back();
    if (f->state != State::kReady) continue;
    switch_to(f);
    if (_setjmp(g.sched_jb) == 0) {
      if (f->started) _longjmp(f->jb, 1);
      f->started = true;
      swapcontext(&g.sched, &f->ctx);  // the first entry; the fiber comes back by _longjmp
    }
    g.cur = nullptr;
    Block& b = *f->blk;
    if (!g.failed && b.live == 0 && b.id >= 0) {  // the block is done: the next one takes its slot
      flush_accesses(b);
      if (next < blocks) {
        start_block(b, next++);
      } else {
        b.id = -1;
      }
    }
  }
  g_hooks_on = false;
  g.ready.clear();
  return !g.failed;
}

}  // namespace emu

// ---- what emu.h declares --------------------------------------------------------------------------------
namespace emu {

__attribute__((noinline)) void ptx(const char* text, std::initializer_list<Operand> outs,
                                   std::initializer_list<Operand> ins) {
  const uintptr_t site = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  if (g.cur == nullptr) {
    fprintf(stderr, "emu: PTX outside a launch: %s\n", text);
    abort();
  }
  const Program& prog = program_of(text);
  Fiber* f = g.cur;
  if (prog.instrs.empty()) return;  // a register dependence only (hopper.cuh's fence_acc): nothing executes
  Regs r;
  const size_t n_out = outs.size();
  if (n_out + ins.size() > static_cast<size_t>(kMaxOps)) fail("PTX '%s': more than %d operands", text, kMaxOps);
  const bool wgmma = std::any_of(prog.instrs.begin(), prog.instrs.end(), [](const Instr& x) { return x.op == Op::kWgmma; });
  size_t i = 0;
  for (const Operand& o : outs) {
    r.op[i] = 0;
    if (o.mode == '+') memcpy(&r.op[i], o.ptr, o.size);  // read here: the kernel's read would be a plain access
    const uintptr_t at = reinterpret_cast<uintptr_t>(o.ptr);
    if (!f->pending.empty() && at >= f->pending_lo && at < f->pending_hi) {
      auto it = f->pending.find(at);
      if (it != f->pending.end()) {
        if (!wgmma) {
          fail("'%s' %s an accumulator register (at %p) of '%s' before the wgmma.wait_group that retires its group: "
               "the register is undefined until then",
               text, o.mode == '+' ? "reads" : "writes", o.ptr, it->second.ins->text.c_str());
        }
        r.op[i] = it->second.value;  // a chained wgmma accumulates into the pending result
      }
    }
    ++i;
  }
  for (const Operand& o : ins) r.op[i++] = o.val;
  r.n = i;
  f->outs = outs.begin();
  f->n_outs = n_out;
  bool memory = false;
  for (size_t k = 0; k < prog.instrs.size(); ++k) {
    const Instr& in = prog.instrs[k];
    memory |= in.memory;
    exec(in, r, site + k);
  }
  i = 0;
  f = g.cur;
  for (const Operand& o : outs) {
    const uint64_t v = r.op[i++];
    memcpy(o.ptr, &v, o.size);
    if (f->wg_fenced && !wgmma) f->dirty.insert(reinterpret_cast<uintptr_t>(o.ptr));  // an ordinary write
  }
  f->outs = nullptr;
  f->n_outs = 0;
  // A memory instruction is a scheduling point one time in kMemoryYield (drawn from the seeded order):
  // every one costs two fiber switches, and barriers and collectives already switch.
  if (memory && next_random() % kMemoryYield == 0) yield();
}

void syncthreads() {
  Block& b = *g.cur->blk;
  if (++b.barrier_arrived < g.threads) {
    block_here(State::kWaitBlock);
    return;
  }
  b.barrier_arrived = 0;
  ++b.epoch;
  flush_accesses(b);
  {
    std::vector<Fiber*> all;
    for (Fiber& o : b.fibers) {
      if (o.state != State::kDone) all.push_back(&o);
    }
    join_observed(all);
  }
  for (Fiber& o : b.fibers) {
    if (&o != g.cur && o.state == State::kWaitBlock) make_ready(&o);
  }
  yield();
}

unsigned char* block_smem() { return g.cur->blk->smem; }

void set_tanh_exact(bool exact) { g_tanh_exact = exact; }

}  // namespace emu

// ---- the hooks g++ -fsanitize=thread calls (libtsan is not linked) ------------------------------------
extern "C" {
#define EMU_HOOK(n)                                                                                      \
  void __tsan_read##n(void* p) { emu::plain_access(reinterpret_cast<uintptr_t>(p), n, false); }           \
  void __tsan_write##n(void* p) { emu::plain_access(reinterpret_cast<uintptr_t>(p), n, true); }           \
  void __tsan_unaligned_read##n(void* p) { emu::plain_access(reinterpret_cast<uintptr_t>(p), n, false); } \
  void __tsan_unaligned_write##n(void* p) { emu::plain_access(reinterpret_cast<uintptr_t>(p), n, true); }
EMU_HOOK(1)
EMU_HOOK(2)
EMU_HOOK(4)
EMU_HOOK(8)
EMU_HOOK(16)
#undef EMU_HOOK
void __tsan_read_range(void* p, unsigned long n) { emu::plain_access(reinterpret_cast<uintptr_t>(p), n, false); }
void __tsan_write_range(void* p, unsigned long n) { emu::plain_access(reinterpret_cast<uintptr_t>(p), n, true); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_init() {}

// ---- the C interface the Python harness calls (tests/emu/emu_harness.py) ---------------------------------
int emu_sizeof_params() { return static_cast<int>(sizeof(FaParams)); }

void emu_set_arch(int arch) { emu::g_arch = arch; }

void emu_set_arch_specific(int on) { emu::g_arch_specific = on != 0; }

void emu_reset_allocations() {
  emu::g.allocations.clear();
  emu::g.alloc_lo = UINTPTR_MAX;
  emu::g.alloc_hi = 0;
}

void emu_set_limits(int max_threads, int registers, int static_smem, int smem_limit) {
  emu::g.limits = emu::Limits{max_threads, registers, static_smem, smem_limit};
}

// A buffer the kernels may use, `guard` bytes of canaries on each side (plain accesses there fail).
void emu_register_guarded(const void* p, uint64_t bytes, uint64_t guard, const char* name) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  emu::Allocation al{a, a + bytes, a - guard, a + bytes + guard, name, {}};
  emu::g.alloc_lo = std::min(emu::g.alloc_lo, al.guard_begin);
  emu::g.alloc_hi = std::max(emu::g.alloc_hi, al.guard_end);
  emu::g.allocations.push_back(std::move(al));
}

void emu_register(const void* p, uint64_t bytes, const char* name) { emu_register_guarded(p, bytes, 0, name); }

const char* emu_error() { return emu::g.error.c_str(); }

uint64_t emu_collectives() { return emu::g.collectives; }

void emu_bank_stats(uint64_t* out) {
  for (int k = 0; k < emu::kAccKinds; ++k) {
    out[3 * k] = emu::g.banks[k].instructions;
    out[3 * k + 1] = emu::g.banks[k].wavefronts;
    out[3 * k + 2] = emu::g.banks[k].ideal;
  }
}

// The order the scheduler runs fibers in (a seed), and how many blocks run at once.
void emu_set_schedule(uint64_t seed, int window) {
  emu::g.seed = seed;
  emu::g.window = window > 0 ? window : 1;
}

// launch.cpp's launch of one entry (kernels/binding/geometry.h entry_launch): out = grid x, y, z,
// threads, dynamic shared memory. Returns the geometry's status (0 ok, 1 empty, 2 no block size, 3
// bad pairs, 4 too many pairs).
int emu_entry_launch(int threads, int block_m, int block_n, int smem_bytes, int grid, const FaParams* p,
                     int64_t limit, int64_t* out) {
  fa_geometry::Launch l{};
  const fa_geometry::Status st = fa_geometry::entry_launch(threads, block_m, block_n, smem_bytes, grid, *p, limit, &l);
  if (st == fa_geometry::Status::kOk) {
    out[0] = l.grid_x;
    out[1] = l.grid_y;
    out[2] = l.grid_z;
    out[3] = l.threads;
    out[4] = l.smem_bytes;
  }
  return static_cast<int>(st);
}

// Runs kernel `fn` over the grid. Returns 0, or 1 with emu_error() set.
int emu_launch(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned threads, int smem_bytes,
               const FaParams* params) {
  using namespace emu;
  g.error.clear();
  g.failed = false;
  g.collectives = 0;
  for (BankStats& b : g.banks) b = BankStats{};
  ++g.launch;
  g.rng = g.seed;
  if (threads == 0 || threads > static_cast<unsigned>(kMaxThreads) || threads % kWarpSize != 0) {
    g.error = "threads per block must be a positive multiple of 32 up to 1024";
    return 1;
  }
  if (smem_bytes < 0 || smem_bytes > kMaxSmem) {
    g.error = "dynamic shared memory above the emulator's 256 KiB";
    return 1;
  }
  const Limits& lim = g.limits;
  char why[256] = {0};
  const int per_warp = (lim.registers * kWarpSize + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  if (lim.max_threads > 0 && threads > static_cast<unsigned>(lim.max_threads)) {
    snprintf(why, sizeof why, "launch of %u threads per block exceeds the kernel's launch bounds of %d", threads,
             lim.max_threads);
  } else if (lim.registers > 0 && static_cast<int64_t>(per_warp) * (threads / kWarpSize) > kRegistersPerBlock) {
    snprintf(why, sizeof why, "launch of %u threads x %d registers needs %lld registers per block; a block has %d",
             threads, lim.registers, static_cast<long long>(per_warp) * (threads / kWarpSize), kRegistersPerBlock);
  } else if (lim.smem_limit > 0 && lim.static_smem + smem_bytes > lim.smem_limit) {
    snprintf(why, sizeof why, "launch needs %d B of shared memory (%d static + %d dynamic); a block may use %d",
             lim.static_smem + smem_bytes, lim.static_smem, smem_bytes, lim.smem_limit);
  }
  if (why[0] != 0) {
    g.error = why;
    return 1;
  }
  g_kernel = reinterpret_cast<KernelFn>(fn);
  g_params = *params;
  g.threads = static_cast<int>(threads);
  g.smem_bytes = smem_bytes;
  g.block_dim = Dim3{threads, 1, 1};
  g.grid_dim = Dim3{gx, gy, gz};
  cur_bdim = g.block_dim;
  cur_gdim = g.grid_dim;
  const int64_t blocks = static_cast<int64_t>(gx) * gy * gz;
  const size_t slots = static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(g.window, blocks)));
  if (g.smem_slots < slots) {  // one arena for every slot's shared memory (plain accesses are found by address)
    if (g.smem_arena != nullptr) munmap(g.smem_arena, g.smem_slots * kMaxSmem);
    g.smem_arena = static_cast<unsigned char*>(
        mmap(nullptr, slots * kMaxSmem, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    g.smem_slots = slots;
    g.blocks.clear();
  }
  while (g.blocks.size() < slots) g.blocks.push_back(std::make_unique<Block>());
  for (size_t s = 0; s < g.blocks.size(); ++s) {
    Block& b = *g.blocks[s];
    b.id = -1;
    b.smem = g.smem_arena + s * kMaxSmem;
    if (b.fibers.size() != threads) {
      for (Fiber& f : b.fibers) munmap(f.stack, kStackBytes);
      b.fibers = std::vector<Fiber>(threads);
      for (unsigned i = 0; i < threads; ++i) {
        Fiber& f = b.fibers[i];
        f.index = static_cast<int>(i);
        f.tid = Dim3{i, 0, 0};
        f.blk = &b;
        f.stack = static_cast<char*>(mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0));
      }
      b.warps = std::vector<WarpOp>(threads / kWarpSize);
      b.wgs = std::vector<Warpgroup>(threads / kWarpgroup);
      for (Warpgroup& w : b.wgs) w.lanes.resize(kWarpgroup);
    }
    b.shadow.assign(static_cast<size_t>(smem_bytes), Shadow{});
  }
  if (blocks == 0) return 0;
  return run_grid(blocks) ? 0 : 1;
}

// A test kernel `void fn(const void* args)` over the grid; as emu_launch otherwise.
int emu_launch_raw(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned threads, int smem_bytes,
                   const void* args) {
  static FaParams unused;
  emu::g_raw_kernel = reinterpret_cast<emu::RawKernelFn>(fn);
  emu::g_raw_args = args;
  const int rc = emu_launch(nullptr, gx, gy, gz, threads, smem_bytes, &unused);
  emu::g_raw_kernel = nullptr;
  return rc;
}

// An sm_90a kernel `void fn(Params, CUtensorMap x n_maps)` (n_maps 3 or 4, the maps' 128-byte images
// in order at `maps`); as emu_launch otherwise.
int emu_launch_maps(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned threads, int smem_bytes,
                    const FaParams* params, const void* maps, int n_maps) {
  if (n_maps != 3 && n_maps != 4) {
    emu::g.error = "an sm_90a kernel takes 3 or 4 tensor maps after its Params";
    return 1;
  }
  emu::g_n_maps = n_maps;
  memcpy(emu::g_maps, maps, 128 * static_cast<size_t>(n_maps));
  const int rc = emu_launch(fn, gx, gy, gz, threads, smem_bytes, params);
  emu::g_n_maps = 0;
  return rc;
}

// The emulator's cuTensorMapEncodeTiled: the driver's arguments, in its order and with its enum values
// (CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
// CUtensorMapFloatOOBfill), checked by the rules the driver API documents; the 128 bytes it writes are the
// emulator's own format (TensorMap), which cp.async.bulk.tensor decodes. Returns 0 (CUDA_SUCCESS) or 1
// (CUDA_ERROR_INVALID_VALUE) with the reason in emu_error().
int emu_tensor_map_encode_tiled(void* tensor_map, int dtype, uint32_t rank, void* global_address,
                                const uint64_t* global_dim, const uint64_t* global_strides, const uint32_t* box_dim,
                                const uint32_t* element_strides, int interleave, int swizzle, int l2_promotion,
                                int oob_fill) {
  using emu::g;
  static const int kBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};  // by CUtensorMapDataType
  auto bad = [](const char* why) {
    g.error = std::string("cuTensorMapEncodeTiled: ") + why;
    return 1;
  };
  g.error.clear();
  if (tensor_map == nullptr || reinterpret_cast<uintptr_t>(tensor_map) % 64 != 0) return bad("tensorMap is not 64-byte aligned");
  if (dtype < 0 || dtype > 12) return bad("tensorDataType is not a CUtensorMapDataType");
  if (rank < 1 || rank > 5) return bad("tensorRank is 1 to 5");
  if (interleave != 0) return bad("interleaved layouts are not emulated (CU_TENSOR_MAP_INTERLEAVE_NONE only)");
  if (swizzle < 0 || swizzle > 3) return bad("swizzle is CU_TENSOR_MAP_SWIZZLE_NONE, 32B, 64B or 128B");
  if (oob_fill != 0) return bad("only CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE (zeros) is emulated");
  if (reinterpret_cast<uintptr_t>(global_address) % 16 != 0) return bad("globalAddress is not 16-byte aligned");
  const uint32_t esize = static_cast<uint32_t>(kBytes[dtype]);
  emu::TensorMap m{};
  m.magic = emu::kTensorMapMagic;
  m.dtype = static_cast<uint8_t>(dtype);
  m.rank = static_cast<uint8_t>(rank);
  m.elem_bytes = static_cast<uint8_t>(esize);
  m.swizzle = static_cast<uint8_t>(swizzle);
  m.l2 = static_cast<uint8_t>(l2_promotion);
  m.address = reinterpret_cast<uintptr_t>(global_address);
  for (uint32_t d = 0; d < rank; ++d) {
    if (global_dim[d] == 0 || global_dim[d] > 0xffffffffull) return bad("globalDim[i] is 1 to 2^32 - 1 here");
    if (box_dim[d] == 0 || box_dim[d] > 256) return bad("boxDim[i] is 1 to 256");
    if (element_strides[d] != 1) return bad("elementStrides other than 1 are not emulated");
    m.dim[d] = static_cast<uint32_t>(global_dim[d]);
    m.box[d] = box_dim[d];
    m.elem_stride[d] = 1;
  }
  for (uint32_t d = 0; d + 1 < rank; ++d) {
    if (global_strides[d] % 16 != 0 || global_strides[d] >= (1ull << 40)) {
      return bad("globalStrides[i] is a multiple of 16 below 2^40");
    }
    m.stride[d] = global_strides[d];
  }
  const uint32_t inner = box_dim[0] * esize;
  if (inner % 16 != 0) return bad("boxDim[0] * element size is a multiple of 16 bytes");
  if (swizzle != 0) {
    const uint32_t span = swizzle == 3 ? 128 : swizzle == 2 ? 64 : 32;
    if (inner > span) return bad("boxDim[0] * element size exceeds the swizzle span");
    if (inner != span) return bad("an inner box narrower than the swizzle span is not emulated");
  }
  memset(tensor_map, 0, 128);
  memcpy(tensor_map, &m, sizeof m);
  return 0;
}

}  // extern "C"
