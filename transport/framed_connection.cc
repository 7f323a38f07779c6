#include "transport/framed_connection.h"

#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/socket.h>

namespace herd::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

FramedConnection::FramedConnection(Socket socket, size_t max_body_bytes)
    : socket_(std::move(socket)), reader_(max_body_bytes) {
  boost::system::error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  peer_ = ec ? "unknown peer" : remote.address().to_string() + ":" + std::to_string(remote.port());
  socket_.set_option(tcp::no_delay(true), ec);
  // Control messages, heartbeats above all, must not queue behind a link's
  // bulk data (a congested link would otherwise starve them until the job
  // declares a healthy process lost): marked low-delay, which priority
  // queues serve first (Linux's default pfifo_fast, DSCP-aware switches).
  // Best effort: a socket that refuses the mark works unmarked.
  const int tos = IPTOS_LOWDELAY;
  ::setsockopt(socket_.native_handle(), IPPROTO_IP, IP_TOS, &tos, sizeof tos);
}

void FramedConnection::Start(MessageHandler on_message, EndHandler on_end) {
  on_message_ = std::move(on_message);
  on_end_ = std::move(on_end);
  Read();
}

void FramedConnection::Read() {
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(buffer_), [this, self](boost::system::error_code ec, size_t n) {
    if (closed_) return;
    if (ec) {
      End(Status::Unavailable(ec == asio::error::eof ? "connection closed" : "connection failed: " + ec.message()));
      return;
    }
    Status st = reader_.Append(buffer_.data(), n);
    wire::Envelope message;
    while (st.ok() && reader_.Next(&message, &st)) {
      on_message_(message);
      if (closing()) return;
    }
    if (!st.ok()) {
      End(st);
      return;
    }
    Read();
  });
}

void FramedConnection::Send(const wire::Envelope& message) {
  if (closed_) return;
  outbox_.push_back(EncodeFrame(message));
  if (!writing_) Write();
}

void FramedConnection::Write() {
  writing_ = true;
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(outbox_.front()), [this, self](boost::system::error_code ec, size_t) {
    if (closed_) return;
    outbox_.pop_front();
    if (ec) {
      End(Status::Unavailable("write failed: " + ec.message()));
      return;
    }
    if (!outbox_.empty()) {
      Write();
      return;
    }
    writing_ = false;
    if (close_after_flush_) {
      Close();
    } else if (shutdown_after_flush_) {
      boost::system::error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
    }
  });
}

void FramedConnection::CloseAfterFlush() {
  close_after_flush_ = true;
  if (!writing_) Close();
}

void FramedConnection::ShutdownSendAfterFlush() {
  shutdown_after_flush_ = true;
  if (!writing_) {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
  }
}

void FramedConnection::Close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // Handlers may hold the owner of this connection: drop them to break the cycle.
  on_message_ = nullptr;
  on_end_ = nullptr;
}

void FramedConnection::End(const Status& status) {
  // The handler may still send a last message (e.g. why a peer is refused)
  // and close after it; otherwise the connection closes now.
  EndHandler handler = std::move(on_end_);
  on_end_ = nullptr;
  if (handler) handler(status);
  if (!closing()) Close();
}

}  // namespace herd::transport
