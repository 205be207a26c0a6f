// Paged KV cache ops on CPU: append_kv and compact_kv (semantics: kernels/cache_ops/reference.py).
//
// Both copy raw bytes (one memcpy per slot, or per head when the new tokens' heads are strided),
// so one implementation serves every dtype. Writes to unmapped positions are dropped, as in the
// reference. Registered as torch.ops.specdec_fast.append_kv / compact_kv.
#include "aten_lean.h"
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kParallelBytes = 1 << 20;  // copy volume below which one thread does it all

// The flat slot of `pos` in `row`, or -1 when the position is unmapped.
inline int64_t slot_of(const int32_t* table, int64_t stride_row, int64_t stride_col, int64_t row, int64_t pos,
                       int64_t max_blocks, int64_t num_blocks, int64_t block_size) {
  if (pos < 0) return -1;
  const int64_t logical = pos / block_size;
  if (logical >= max_blocks) return -1;
  const int64_t block = table[row * stride_row + logical * stride_col];
  if (block < 0 || block >= num_blocks) return -1;
  return block * block_size + pos % block_size;
}

void check_index(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dims, name, " must have ", dims, " dims, got ", t.dim());
}

void append_kv_cpu(const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& block_table, const at::Tensor& seq_lens, const at::Tensor& cu_query_lens) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), "k_cache, v_cache must be [NB, BS, Hkv, D] alike");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "k_cache and v_cache must be contiguous");
  TORCH_CHECK(k_new.dim() == 3 && k_new.sizes() == v_new.sizes(), "k_new, v_new must be [T, Hkv, D] alike");
  TORCH_CHECK(k_new.size(1) == k_cache.size(2) && k_new.size(2) == k_cache.size(3), "k_new [T, Hkv, D] must match the cache");
  TORCH_CHECK(k_new.scalar_type() == k_cache.scalar_type() && v_new.scalar_type() == k_cache.scalar_type() &&
                  v_cache.scalar_type() == k_cache.scalar_type(), "k_new, v_new, k_cache, v_cache must share one dtype");
  TORCH_CHECK(k_new.stride(2) == 1 && v_new.stride(2) == 1, "k_new and v_new need a unit stride in their last dim");
  TORCH_CHECK(k_cache.device().is_cpu() && k_new.device().is_cpu() && v_new.device().is_cpu(), "append_kv (C++) runs on CPU tensors");
  check_index(block_table, "block_table", 2);
  check_index(seq_lens, "seq_lens", 1);
  check_index(cu_query_lens, "cu_query_lens", 1);
  const int64_t batch = cu_query_lens.size(0) - 1;
  TORCH_CHECK(batch >= 0 && block_table.size(0) == batch && seq_lens.size(0) == batch, "block_table, seq_lens need B rows");

  const at::Tensor lens = seq_lens.contiguous(), cu_t = cu_query_lens.contiguous();
  const int32_t* lens_p = lens.data_ptr<int32_t>();
  const int32_t* cu = cu_t.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t bt_row = block_table.stride(0), bt_col = block_table.stride(1), max_blocks = block_table.size(1);
  const int64_t num_blocks = k_cache.size(0), block_size = k_cache.size(1), heads = k_cache.size(2), dim = k_cache.size(3);
  const int64_t elem = k_cache.element_size(), head_bytes = dim * elem, slot_bytes = heads * head_bytes;
  const int64_t num_tokens = batch > 0 ? std::min<int64_t>(cu[batch], k_new.size(0)) : 0;
  const bool k_dense = heads == 1 || k_new.stride(1) == dim, v_dense = heads == 1 || v_new.stride(1) == dim;
  const char* kn = static_cast<const char*>(k_new.data_ptr());
  const char* vn = static_cast<const char*>(v_new.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t kst = k_new.stride(0) * elem, ksh = k_new.stride(1) * elem;
  const int64_t vst = v_new.stride(0) * elem, vsh = v_new.stride(1) * elem;

  // Parallel over tokens (a prefill row can hold most of them), in chunks of >= 1 MB of copies:
  // a decode step (8 rows x 5 tokens, 8 x 128 bf16: 160 KB) copies in ~8 us on one thread,
  // while waking a second thread cost 10-20 ms on the loaded 2-core CI box (measured).
  const int64_t grain = std::max<int64_t>(1, kParallelBytes / std::max<int64_t>(1, 2 * slot_bytes));
  at::parallel_for(0, num_tokens, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = std::upper_bound(cu + 1, cu + 1 + batch, static_cast<int32_t>(t)) - (cu + 1);
      if (row >= batch || t < cu[row]) continue;
      const int64_t slot = slot_of(table, bt_row, bt_col, row, lens_p[row] + (t - cu[row]), max_blocks, num_blocks, block_size);
      if (slot < 0) continue;
      char* kd = kc + slot * slot_bytes;
      char* vd = vc + slot * slot_bytes;
      if (k_dense) {
        std::memcpy(kd, kn + t * kst, slot_bytes);
      } else {
        for (int64_t h = 0; h < heads; ++h) std::memcpy(kd + h * head_bytes, kn + t * kst + h * ksh, head_bytes);
      }
      if (v_dense) {
        std::memcpy(vd, vn + t * vst, slot_bytes);
      } else {
        for (int64_t h = 0; h < heads; ++h) std::memcpy(vd + h * head_bytes, vn + t * vst + h * vsh, head_bytes);
      }
    }
  });
}

void compact_kv_cpu(const at::Tensor& caches, const at::Tensor& block_table, const at::Tensor& seq_lens,
                    const at::Tensor& path_positions) {
  TORCH_CHECK(caches.device().is_cpu(), "compact_kv (C++) runs on CPU tensors");
  TORCH_CHECK(caches.dim() == 6 && caches.size(1) == 2, "caches must be [L, 2, NB, BS, Hkv, D]");
  TORCH_CHECK(caches.is_contiguous(), "caches must be contiguous");
  check_index(block_table, "block_table", 2);
  check_index(seq_lens, "seq_lens", 1);
  check_index(path_positions, "path_positions", 2);
  const int64_t batch = path_positions.size(0), path_len = path_positions.size(1);
  TORCH_CHECK(block_table.size(0) == batch && seq_lens.size(0) == batch, "block_table, seq_lens need B rows");

  const at::Tensor lens = seq_lens.contiguous(), path_t = path_positions.contiguous();
  const int32_t* lens_p = lens.data_ptr<int32_t>();
  const int32_t* path = path_t.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t bt_row = block_table.stride(0), bt_col = block_table.stride(1), max_blocks = block_table.size(1);
  const int64_t planes = caches.size(0) * 2, num_blocks = caches.size(2), block_size = caches.size(3);
  const int64_t slot_bytes = caches.size(4) * caches.size(5) * caches.element_size();
  const int64_t plane_bytes = num_blocks * block_size * slot_bytes;
  char* base = static_cast<char*>(caches.data_ptr());

  // One work item per (row, layer x {K,V}): gather the path's slots into a buffer, then
  // scatter them, so overlapping moves read the old values. Chunks of >= 1 MB (see append_kv).
  const int64_t grain = std::max<int64_t>(1, kParallelBytes / std::max<int64_t>(1, 2 * path_len * slot_bytes));
  at::parallel_for(0, batch * planes, grain, [&](int64_t i0, int64_t i1) {
    std::vector<int64_t> src, dst;
    std::vector<char> buffer;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t row = item / planes, plane = item % planes;
      src.clear();
      dst.clear();
      for (int64_t j = 0; j < path_len; ++j) {
        const int64_t node = path[row * path_len + j];
        if (node < 0) break;
        if (node == j) continue;
        const int64_t s = slot_of(table, bt_row, bt_col, row, lens_p[row] + node, max_blocks, num_blocks, block_size);
        const int64_t d = slot_of(table, bt_row, bt_col, row, lens_p[row] + j, max_blocks, num_blocks, block_size);
        if (s < 0 || d < 0) continue;
        src.push_back(s);
        dst.push_back(d);
      }
      if (src.empty()) continue;
      char* plane_p = base + plane * plane_bytes;
      buffer.resize(src.size() * slot_bytes);
      for (size_t k = 0; k < src.size(); ++k) std::memcpy(buffer.data() + k * slot_bytes, plane_p + src[k] * slot_bytes, slot_bytes);
      for (size_t k = 0; k < dst.size(); ++k) std::memcpy(plane_p + dst[k] * slot_bytes, buffer.data() + k * slot_bytes, slot_bytes);
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdec_fast, m) {
  m.def(
      "append_kv(Tensor k_new, Tensor v_new, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor block_table, "
      "Tensor seq_lens, Tensor cu_query_lens) -> ()");
  m.def("compact_kv(Tensor(a!) caches, Tensor block_table, Tensor seq_lens, Tensor path_positions) -> ()");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("append_kv", &append_kv_cpu);
  m.impl("compact_kv", &compact_kv_cpu);
}
