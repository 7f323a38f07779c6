// One TCP connection carrying length-prefixed control messages (wire.h),
// driven by the io_context that owns its socket. Shared by the coordinator
// (one per process) and the coordinator client. Every callback runs on the
// io_context's thread; none runs after Close().
#pragma once

#include <array>
#include <chrono>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/wire.h"

namespace herd::transport {

// Seconds as the integral duration Asio timers take.
inline std::chrono::steady_clock::duration ToDuration(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using Socket = boost::asio::ip::tcp::socket;
  using MessageHandler = std::function<void(const wire::Envelope&)>;
  // Called once when the connection ends on its own: Unavailable for a
  // closed or failed socket, Corruption for a bad frame (oversized, garbage,
  // invalid fields).
  using EndHandler = std::function<void(const Status&)>;

  FramedConnection(Socket socket, size_t max_body_bytes);

  // Starts reading; `on_message` sees only validated messages.
  void Start(MessageHandler on_message, EndHandler on_end);
  void Send(const wire::Envelope& message);
  // Closes once everything queued has been written.
  void CloseAfterFlush();
  // Half-closes the sending side after the queue drains (the peer reads
  // EOF); reading goes on.
  void ShutdownSendAfterFlush();
  void Close();

  void set_max_body_bytes(size_t n) { reader_.set_max_body_bytes(n); }
  bool closed() const { return closed_; }
  bool closing() const { return closed_ || close_after_flush_; }
  const std::string& peer() const { return peer_; }  // "ip:port"

 private:
  void Read();
  void Write();
  void End(const Status& status);

  Socket socket_;
  std::string peer_;
  FrameReader reader_;
  std::array<char, 64 * 1024> buffer_;
  std::deque<std::string> outbox_;
  bool writing_ = false, close_after_flush_ = false, shutdown_after_flush_ = false, closed_ = false;
  MessageHandler on_message_;
  EndHandler on_end_;
};

}  // namespace herd::transport
