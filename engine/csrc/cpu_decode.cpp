// Fused paged decode attention for CPU: one query token per sequence, keys and values read in place through the
// block table (no gathered copy), one task per sequence.
//
// Cache layout [num_blocks, block_size, kv_heads, head_dim]; slot s of block b holds position b * block_size + s.
// Visibility matches AttentionMetadata.visible: the query at position q = context - 1 sees p <= q, and with a
// window W > 0 only p < sinks or p > q - W. Blocks released by sink+window are -1 in the table and never read.
//
// Two passes over the context: scores (K) then the weighted sum (V), with an exact softmax in between (its exp is a
// vectorizable polynomial). Arithmetic is float32 whatever the cache dtype.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

struct Shape {
  int64_t batch, heads, kv_heads, dim, block_size, table_width, sinks, window;
};

// exp(x) for x <= 0 (scores minus their maximum), to ~2 ulp: 2^(x log2 e) split into 2^n (exponent bits) and
// 2^f, f in [-0.5, 0.5], by a degree-6 polynomial. Branch-free, so `omp simd` vectorizes it; std::exp does not.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // below this exp underflows float anyway
  const float t = x * 1.44269504088896341f;
  const float n = std::nearbyint(t);
  const float f = t - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Converts n consecutive slots of one block (all KV heads) to float32: blocks are read whole and in order, which
// streams; reading one head's slices of every slot would stride through memory and stall on each cache line.
template <typename T>
inline void load_block(const T* src, float* dst, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
void decode(const float* query, const T* key_cache, const T* value_cache, const int32_t* tables,
            const int32_t* context_lens, float* out, const Shape& s, float scale) {
  const int64_t heads = s.heads, group = s.heads / s.kv_heads, dim = s.dim, bs = s.block_size;
  const int64_t slot = s.kv_heads * dim;  // elements per slot (token) of a block
  at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, tile(bs * slot), acc(heads * dim), q(heads * dim), peak(heads), total(heads);
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t context = context_lens[seq], query_pos = context - 1;
      const int64_t num_blocks = (context + bs - 1) / bs;
      const int32_t* table = tables + seq * s.table_width;
      auto visible = [&](int64_t p) { return s.window <= 0 || p < s.sinks || p > query_pos - s.window; };
      // Query head i = h * group + g pairs with KV head h (HF's repeat_kv order).
      for (int64_t i = 0; i < heads * dim; ++i) q[i] = query[seq * heads * dim + i] * scale;
      scores.resize(heads * context);  // [query head][visible key], in position order
      std::fill(peak.begin(), peak.end(), -std::numeric_limits<float>::infinity());
      int64_t seen = 0;
      for (int64_t b = 0; b < num_blocks; ++b) {  // pass 1: scores
        if (table[b] < 0) continue;  // released by sink+window: nothing visible in it
        const int64_t first = b * bs, n = std::min(bs, context - first);
        load_block(key_cache + static_cast<int64_t>(table[b]) * bs * slot, tile.data(), n * slot);
        for (int64_t t = 0; t < n; ++t) {
          if (!visible(first + t)) continue;
          for (int64_t i = 0; i < heads; ++i) {
            const float* k = tile.data() + t * slot + (i / group) * dim;
            const float* qi = q.data() + i * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; ++d) dot += qi[d] * k[d];
            scores[i * context + seen] = dot;
            peak[i] = std::max(peak[i], dot);
          }
          ++seen;
        }
      }
      for (int64_t i = 0; i < heads; ++i) {  // softmax numerators and denominators
        float* si = scores.data() + i * context;
        const float m = peak[i];
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < seen; ++j) {
          si[j] = exp_nonpositive(si[j] - m);
          sum += si[j];
        }
        total[i] = sum;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      seen = 0;
      for (int64_t b = 0; b < num_blocks; ++b) {  // pass 2: the weighted sum of values, in the same order
        if (table[b] < 0) continue;
        const int64_t first = b * bs, n = std::min(bs, context - first);
        load_block(value_cache + static_cast<int64_t>(table[b]) * bs * slot, tile.data(), n * slot);
        for (int64_t t = 0; t < n; ++t) {
          if (!visible(first + t)) continue;
          for (int64_t i = 0; i < heads; ++i) {
            const float w = scores[i * context + seen];
            const float* v = tile.data() + t * slot + (i / group) * dim;
            float* ai = acc.data() + i * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) ai[d] += w * v[d];
          }
          ++seen;
        }
      }
      float* o = out + seq * heads * dim;
      for (int64_t i = 0; i < heads; ++i)
        for (int64_t d = 0; d < dim; ++d) o[i * dim + d] = acc[i * dim + d] / total[i];
    }
  });
}

}  // namespace

// query [B, H, D] float32; caches [N, block_size, Hkv, D]; block_tables [B, W] int32; context_lens [B] int32.
torch::Tensor paged_decode(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale, int64_t sinks,
                           int64_t window) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat32 && query.is_contiguous(), "query: contiguous float32");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type(), "key and value caches differ in dtype");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(), "tables: int32");
  TORCH_CHECK(context_lens.scalar_type() == torch::kInt32 && context_lens.is_contiguous(), "lens: int32");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  Shape s{query.size(0), query.size(1), key_cache.size(2), key_cache.size(3), key_cache.size(1),
          block_tables.size(1), sinks, window};
  auto out = torch::empty_like(query);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key_cache.scalar_type(), "paged_decode", [&] {
    decode<scalar_t>(query.data_ptr<float>(), key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(),
                     block_tables.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), out.data_ptr<float>(), s,
                     static_cast<float>(scale));
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "fused paged decode attention (CPU)");
}
