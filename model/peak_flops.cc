#include "model/peak_flops.h"

namespace herd {
namespace {

struct Peak {
  const char* all[2];  // substrings the name must contain (null: none)
  const char* none;    // one it must not (null: none)
  double bf16, fp32;   // dense TFLOP/s, NVIDIA's datasheets
};

// Most specific first: the first entry that matches is taken.
constexpr Peak kPeaks[] = {
    {{"H200", "NVL"}, nullptr, 835, 60},   // H200 NVL
    {{"H200", nullptr}, nullptr, 989, 67},  // H200 SXM
    {{"H100", "NVL"}, nullptr, 835, 60},   // H100 NVL
    {{"H100", "PCIe"}, nullptr, 756, 51},  // H100 PCIe
    {{"H100", nullptr}, nullptr, 989, 67},  // H100 SXM ("NVIDIA H100 80GB HBM3")
    {{"A100", nullptr}, nullptr, 312, 19.5},
    {{"L40S", nullptr}, nullptr, 362, 91.6},
    {{"L4", nullptr}, "L40", 121, 30.3},
};

bool Contains(const std::string& s, const char* part) { return part == nullptr || s.find(part) != std::string::npos; }

}  // namespace

double DatasheetPeakTflops(const std::string& device, bool bf16) {
  for (const Peak& p : kPeaks) {
    if (Contains(device, p.all[0]) && Contains(device, p.all[1]) && (p.none == nullptr || !Contains(device, p.none))) {
      return bf16 ? p.bf16 : p.fp32;
    }
  }
  return 0;
}

}  // namespace herd
