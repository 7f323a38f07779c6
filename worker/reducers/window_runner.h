// Carries out a WeightWindow's actions (sharding/weight_window.h) on a
// worker's paged weights: a bucket's pages are admitted before it is
// filled and given back once the window lets it go (after its fill has
// landed: nothing lands in memory given back). How a bucket is filled and
// waited for, and how its final gradients are sent and that waited for,
// is the strategy's (BucketMoves): pulls from and pushes to parameter
// servers (cluster.stream_weights), or all-gathers and reduce-scatters
// among the workers that own its slices (ZeRO-3).
#pragma once

#include <vector>

#include "common/paged_buffer.h"
#include "sharding/weight_window.h"

namespace herd {

// Bucket indices are the window's (forward order).
class BucketMoves {
 public:
  virtual ~BucketMoves() = default;
  // Starts bringing bucket i's weights into its (admitted) pages.
  virtual void Fill(int i) = 0;
  // Waits for bucket i's fill; a failure is the strategy's to keep.
  virtual void Land(int i) = 0;
  // Starts sending bucket i's final gradients.
  virtual void Send(int i) = 0;
  // Waits for bucket i's send and lets go of the gradients it no longer needs.
  virtual void Retire(int i) = 0;
};

class WindowRunner {
 public:
  // `weights`: the flat space the window pages; `moves` outlives this.
  WindowRunner(WeightWindow window, PagedBuffer* weights, BucketMoves* moves);

  WeightWindow& window() { return window_; }
  // What the window says, in its order.
  void Execute(const WeightWindow::Actions& a);

 private:
  void Land(int i);

  WeightWindow window_;
  PagedBuffer* const weights_;
  BucketMoves* const moves_;
  std::vector<bool> landed_;  // per bucket: its latest fill waited for (or none)
};

}  // namespace herd
