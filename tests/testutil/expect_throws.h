// expect_throws<E>(f): runs f, checks that it throws E (a wrong exception type or none is a test
// failure) and returns the message, so a test can check what the error says;
// expect_throws_with<E>(f, {parts...}) also checks that the message contains every part.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace dtrain::testutil {

template <class E, class F>
std::string expect_throws(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no exception";
  return {};
}

template <class E, class F>
void expect_throws_with(F&& f, std::initializer_list<std::string_view> parts) {
  const std::string message = expect_throws<E>(std::forward<F>(f));
  for (std::string_view p : parts) {
    EXPECT_NE(message.find(p), std::string::npos)
        << "message \"" << message << "\" lacks \"" << p << "\"";
  }
}

}  // namespace dtrain::testutil
