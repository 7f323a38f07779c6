#include "worker/placements/tied_embedding.h"

#include "common/trace.h"

namespace herd {

using transport::StageMessage;

TiedEmbeddingExchange::TiedEmbeddingExchange(transport::PipelineWire* wire, transport::PeerId peer, bool first,
                                             int last_virtual_stage, int64_t embedding_end)
    : wire_(wire),
      peer_(peer),
      first_(first),
      last_virtual_stage_(last_virtual_stage),
      end_(embedding_end),
      other_(embedding_end) {}

Status TiedEmbeddingExchange::Exchange(float* grads, uint64_t step) {
  trace::Span span("embedding exchange", "collective", {"step", static_cast<int64_t>(step + 1)});
  const StageMessage out{StageMessage::kEmbeddingGradient, step, 0, first_ ? last_virtual_stage_ : 0, end_};
  const StageMessage in{StageMessage::kEmbeddingGradient, step, 0, first_ ? 0 : last_virtual_stage_, end_};
  const auto sent = wire_->Send(peer_, out, grads);
  Status st = wire_->Receive(peer_, in, other_.data()).status();
  Status sent_st = wire_->WaitSent(sent);
  if (st.ok()) st = sent_st;
  HERD_RETURN_IF_ERROR(st.WithContext("tied embedding exchange: "));
  const float* head = first_ ? other_.data() : grads;
  const float* lookup = first_ ? grads : other_.data();
  for (int64_t i = 0; i < end_; ++i) grads[i] = head[i] + lookup[i];
  return Status::OK();
}

}  // namespace herd
