// RoPE frequency scaling: Llama 3.1's "llama3" rope type, as HuggingFace
// transformers computes it (_compute_llama3_parameters). With
// wavelen = 2π / inv_freq, frequencies whose wavelength exceeds
// original_max_position_embeddings / low_freq_factor are divided by
// factor, those below original_max_position_embeddings / high_freq_factor
// are kept, and those between are interpolated smoothly.
#pragma once

namespace herd {

struct RopeScaling {
  double factor = 0;  // 0: no scaling (plain RoPE)
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  double original_max_position_embeddings = 0;

  bool llama3() const { return factor > 0; }
};

}  // namespace herd
