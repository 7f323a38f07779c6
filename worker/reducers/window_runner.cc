#include "worker/reducers/window_runner.h"

#include <utility>

namespace herd {

WindowRunner::WindowRunner(WeightWindow window, PagedBuffer* weights, BucketMoves* moves)
    : window_(std::move(window)), weights_(weights), moves_(moves), landed_(window_.num_buckets(), true) {}

void WindowRunner::Execute(const WeightWindow::Actions& a) {
  for (int i : a.release) {
    const ParamRange& r = window_.bucket(i).range;
    Land(i);
    weights_->Release(r.begin * sizeof(float), r.size() * sizeof(float));
  }
  for (int i : a.pull) {
    const ParamRange& r = window_.bucket(i).range;
    weights_->Admit(r.begin * sizeof(float), r.size() * sizeof(float));
    moves_->Fill(i);
    landed_[i] = false;
  }
  for (int i : a.wait) Land(i);
  for (int i : a.push) moves_->Send(i);
  for (int i : a.retire) moves_->Retire(i);
}

void WindowRunner::Land(int i) {
  if (landed_[i]) return;
  landed_[i] = true;
  moves_->Land(i);
}

}  // namespace herd
